"""The tensors a server builds for a drafter config, compared with model.safetensors' header.

``expected(got, n_features, bias, conv, selector) -> {name: shape}``: the names the published drafters use
(and ``DFlashDrafter.state_dict()``): ``fc.weight (H, n*H)``, ``hidden_norm.weight``, ``norm.weight``, per
layer ``self_attn.{q,k,v,o}_proj.weight`` (+ ``.bias`` with ``attention_bias``), ``self_attn.{q,k}_norm.weight
(head_dim)``, ``mlp.{gate,up,down}_proj.weight``, ``{input,post_attention}_layernorm.weight``; with ``conv =
(taps, group)`` also ``{attention,mlp}_conv.base_kernel (2, taps, H)`` and ``.kernel_projection.weight
(2*taps*H/group, H)``; with ``selector = rank`` ``candidate_selector.{predecessor,successor}_codebook (V,
rank)`` and ``.hidden_projection.weight (rank, H)``. ``compare`` reports missing tensors (error: every server
leaves the parameter at its initial value or refuses), wrong shapes (error: their weight loaders refuse), and
tensors no parameter takes (``unexpected``: the severity the server gives them). ``dtypes`` wants floating
point tensors (F32/F16/BF16: the servers cast them to the serving dtype).
"""

from __future__ import annotations

from trainer.exporting.problems import Problem, error, key_of, shown, warning

FLOAT_DTYPES = ("F32", "F16", "BF16")
_DTYPE_NAMES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}


def _layer(i: int, got: dict, bias: bool) -> dict[str, tuple[int, ...]]:
    h, i_, hd = got["hidden_size"], got["intermediate_size"], got["head_dim"]
    q, kv = got["num_attention_heads"] * hd, got["num_key_value_heads"] * hd
    p = f"layers.{i}."
    out = {
        p + "self_attn.q_proj.weight": (q, h),
        p + "self_attn.k_proj.weight": (kv, h),
        p + "self_attn.v_proj.weight": (kv, h),
        p + "self_attn.o_proj.weight": (h, q),
        p + "self_attn.q_norm.weight": (hd,),
        p + "self_attn.k_norm.weight": (hd,),
        p + "mlp.gate_proj.weight": (i_, h),
        p + "mlp.up_proj.weight": (i_, h),
        p + "mlp.down_proj.weight": (h, i_),
        p + "input_layernorm.weight": (h,),
        p + "post_attention_layernorm.weight": (h,),
    }
    if bias:
        out.update(
            {
                p + "self_attn.q_proj.bias": (q,),
                p + "self_attn.k_proj.bias": (kv,),
                p + "self_attn.v_proj.bias": (kv,),
                p + "self_attn.o_proj.bias": (h,),
            }
        )
    return out


def expected(
    got: dict, n_features: int, bias: bool, conv: tuple[int, int] | None = None, selector: int | None = None
) -> dict[str, tuple[int, ...]]:
    h = got["hidden_size"]
    out = {"fc.weight": (h, n_features * h), "hidden_norm.weight": (h,), "norm.weight": (h,)}
    for i in range(got["num_hidden_layers"]):
        out.update(_layer(i, got, bias))
        if conv:
            taps, group = conv
            for m in ("attention_conv", "mlp_conv"):
                out[f"layers.{i}.{m}.base_kernel"] = (2, taps, h)
                out[f"layers.{i}.{m}.kernel_projection.weight"] = (2 * taps * (h // group), h)
    if selector:
        v = got["vocab_size"]
        out["candidate_selector.predecessor_codebook"] = (v, selector)
        out["candidate_selector.successor_codebook"] = (v, selector)
        out["candidate_selector.hidden_projection.weight"] = (selector, h)
    return out


def compare(tensors: dict, want: dict, *, unexpected: str, who: str, ignored=()) -> list[Problem]:
    """``unexpected``: ``"error"`` or ``"warning"``; ``ignored``: name suffixes the server skips silently."""
    out = []
    for name, shape in want.items():
        t = tensors.get(name)
        if t is None:
            out.append(
                error(
                    name,
                    f"missing from model.safetensors: {who} would leave it at its initial value "
                    "or refuse the checkpoint",
                )
            )
        elif t.shape != shape:
            out.append(error(name, f"shape {list(t.shape)}, the config makes {list(shape)}"))
    extra = sorted(n for n in tensors if n not in want and not n.endswith(tuple(ignored)))
    make = error if unexpected == "error" else warning
    verdict = "refuses it" if unexpected == "error" else "ignores it"
    out += [
        make(key_of(n), f"no parameter of the drafter takes this tensor: {who} {verdict}") for n in extra[:8]
    ]
    if len(extra) > 8:
        out.append(make("model.safetensors", f"and {len(extra) - 8} more tensors no parameter takes"))
    return out


def dtypes(tensors: dict, top: dict) -> list[Problem]:
    out, seen = [], sorted({t.dtype for t in tensors.values()})
    bad = [d for d in seen if d not in FLOAT_DTYPES]
    if bad:
        out.append(
            error(
                "model.safetensors",
                f"tensors of dtype {', '.join(bad)}: the servers load a drafter's "
                "weights as unquantized F32/F16/BF16",
            )
        )
    if len(seen) > 1:
        out.append(warning("model.safetensors", f"tensors of several dtypes ({', '.join(seen)})"))
    declared = top.get("dtype", top.get("torch_dtype"))
    if declared is not None and len(seen) == 1 and _DTYPE_NAMES.get(declared) != seen[0]:
        out.append(
            warning(
                "dtype",
                f'{shown(declared)} but the tensors are {seen[0]} (dtype="auto" loads use the config\'s)',
            )
        )
    return out
