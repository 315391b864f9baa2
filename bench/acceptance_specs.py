"""bench_acceptance.py's ``--blocks`` drafter specs: ``block:layers[:arch[:pattern[:window]]]``, comma-separated.

- ``arch``: a trainer ``--arch`` (``dflash``, ``dflash2``) or a bench variant (``VARIANTS``); empty or absent:
  the trainer's default (DFlash 1). A suffix ``@fp8`` (``8:2:dflash@fp8``, ``8:2:@fp8``) trains the drafter on
  hidden states captured from the FP8 version of the target (bench/acceptance_fp8.py: the target written as an
  FP8 checkpoint in Qwen's block-128 layout, the trainer's ``--target-dtype fp8``) instead of the bf16 one
  (``@bf16``, the default); everything else is the same (data, seed, steps). Its bf16-captured twin (the spec
  without ``@fp8``) is trained too, once, listed or not: ``capture_pairs`` pairs the two, evaluated against the
  bf16 target and against the FP8 one. A suffix ``@t`` with dash-separated layer ids (``8:2:dflash@t3-7``,
  ``8:2:dflash@fp8@t3-7``) trains on those target layers (the trainer's ``--target-layer-ids``) instead of the
  trainer's default spread ([1, 5] for 8 target layers and 2 draft layers: both Gated DeltaNet layers of the
  hybrid h384 target; 3 and 7 are its attention layers); it is compared with the same spec on the default layers
  where both are trained. A suffix ``@s`` with a seed (``8:2:dflash@s2``) trains that drafter with this seed
  instead of the run's drafter seed (``--drafter-seed``, else ``--seed``), so one run trains several seeds of a
  drafter side by side (the spread of training itself); it is paired with the same spec without a seed;
- ``pattern``: the draft layers' attention, one letter a layer: ``S`` sliding window, ``F`` full (the trainer's
  ``--layer-types``), e.g. SpecForge's Qwen3.6-27B recipe ``16:5:dflash:SSSSF``; absent: all full;
- ``window``: the sliding layers' window (``--sliding-window``), default ``DEFAULT_WINDOW`` (the recipe's 2048;
  the bench's 512-byte rows never reach it, so there a sliding layer attends as a full one: ``:256`` makes the
  window cut).

A spec's run-directory tag (``tag_of``) and results key (``key_of``: the target's tag first, so that results of
two targets never share a key) name every part that is set.
"""

from __future__ import annotations

from typing import NamedTuple

DEFAULT_WINDOW = 2048
CAPTURE_DTYPES = ("bf16", "fp8")
LAYER_LETTERS = {"S": "sliding_attention", "F": "full_attention"}
# --blocks arch names that are a trainer architecture plus flags (the result key keeps the name);
# dflash2ug: the selector's loss also through the unary logits (speculators' objective)
VARIANTS = {"dflash2ug": ("dflash2", ["--selector-unary-grad"])}


class Spec(NamedTuple):
    block: int
    layers: int
    arch: str | None = None
    text: str | None = None  # the training text's name (``--train-text compare``), None: the data
    pattern: str | None = None  # "SSSSF": one letter a draft layer
    window: int | None = None  # the sliding layers' window (a pattern with an S only)
    capture: str | None = None  # "fp8": trained on the FP8 target's hidden states; None: the bf16 target's
    target_layers: tuple[int, ...] | None = None  # --target-layer-ids; None: the trainer's default
    seed: int | None = None  # the drafter's training seed; None: the run's (--drafter-seed, else --seed)


def _int(part: str, what: str, spec: str, low: int) -> int:
    try:
        v = int(part)
    except ValueError:
        raise ValueError(f"--blocks {spec!r}: {what} {part!r} is not an integer") from None
    if v < low:
        raise ValueError(f"--blocks {spec!r}: {what} must be >= {low}, got {v}")
    return v


def parse_spec(spec: str) -> Spec:
    """One ``block:layers[:arch[:pattern[:window]]]``, checked (a clear ValueError for bad input)."""
    parts = spec.strip().split(":")
    if not 2 <= len(parts) <= 5:
        raise ValueError(f"--blocks {spec!r}: expected block:layers[:arch[:pattern[:window]]]")
    block, layers = _int(parts[0], "block", spec, 2), _int(parts[1], "layers", spec, 1)
    arch, capture, target_layers, seed = _arch(parts[2] if len(parts) > 2 else "", spec)
    pattern = parts[3].upper() if len(parts) > 3 and parts[3] else None
    if pattern is not None and (set(pattern) - set(LAYER_LETTERS) or len(pattern) != layers):
        raise ValueError(f"--blocks {spec!r}: pattern {parts[3]!r} must be {layers} letters of S and F")
    window = _int(parts[4], "window", spec, 1) if len(parts) > 4 else None
    sliding = pattern is not None and "S" in pattern
    if window is not None and not sliding:
        raise ValueError(f"--blocks {spec!r}: a window needs a pattern with sliding (S) layers")
    window = window or (DEFAULT_WINDOW if sliding else None)
    return Spec(block, layers, arch, None, pattern, window, capture, target_layers, seed)


def _arch(part: str, spec: str) -> tuple[str | None, str | None, tuple[int, ...] | None, int | None]:
    """``arch[@dtype][@tA-B..][@sN]`` -> (arch or None, capture: "fp8" or None for bf16, target layer ids or
    None, the drafter's seed or None)."""
    arch, *mods = part.split("@")
    dtype, layers, seed = "", None, None
    for m in mods:
        if m.startswith("s") and seed is None:
            seed = _int(m[1:], "seed", spec, 0)
        elif m.startswith("t") and layers is None:
            layers = tuple(_int(x, "target layer", spec, 0) for x in m[1:].split("-"))
            if len(set(layers)) != len(layers) or not layers:
                raise ValueError(f"--blocks {spec!r}: target layers {m[1:]!r} must be distinct ids")
        elif m in CAPTURE_DTYPES and not dtype:
            dtype = m
        else:
            raise ValueError(
                f"--blocks {spec!r}: capture dtype {m!r} is not one of {', '.join(CAPTURE_DTYPES)} (nor "
                "target layers such as t3-7, nor a seed such as s2), or is given twice"
            )
    return arch or None, ("fp8" if dtype == "fp8" else None), layers, seed


def parse_specs(blocks: str, train_text: str) -> list[Spec]:
    """``--blocks`` as specs; ``--train-text compare`` trains each on both texts (text ``original`` and
    ``regenerated``), else text is None (the ``data`` directory). An ``@fp8`` spec brings its bf16-captured
    twin, just before it, unless it is already listed."""
    texts = ("original", "regenerated") if train_text == "compare" else (None,)
    listed = [parse_spec(x)._replace(text=t) for x in blocks.split(",") if x.strip() for t in texts]
    specs: list[Spec] = []
    for s in listed:
        twin = s._replace(capture=None)
        if s.capture and twin not in listed and twin not in specs:
            specs.append(twin)
        specs.append(s)
    return specs


def _name(spec: Spec) -> str:
    out = (f"_{spec.arch}" if spec.arch else "") + (f"_{spec.pattern}" if spec.pattern else "")
    if spec.window is not None and spec.window != DEFAULT_WINDOW:
        out += f"w{spec.window}"
    out += f"_{spec.capture}cap" if spec.capture else ""
    out += f"_{_layers_tag(spec)}" if spec.target_layers else ""
    out += f"_s{spec.seed}" if spec.seed is not None else ""
    return out + (f"_{spec.text}" if spec.text else "")


def _layers_tag(spec: Spec) -> str:
    """``t3-7`` for target layers (3, 7): as ``--blocks`` spells them."""
    return "t" + "-".join(map(str, spec.target_layers or ()))


def tag_of(spec: Spec) -> str:
    """A drafter's name in the work directory (``run_<tag>``) and in the logs."""
    return f"b{spec.block}{_name(spec)}"


def key_of(spec: Spec, target: str) -> str:
    """A drafter's key in results.json: the target's tag, then the spec (``qwen3_5_h384_block16_dflash_SSSSF``;
    an FP8-captured one ``qwen3_5_h384_block8_dflash_fp8cap``)."""
    return f"{target}_block{spec.block}{_name(spec)}"


def drafter_flags(spec: Spec) -> list[str]:
    """The trainer flags of the spec's architecture and layer pattern."""
    argv: list[str] = []
    if spec.arch:
        base, extra = VARIANTS.get(spec.arch, (spec.arch, []))
        argv += ["--arch", base, *extra]
    if spec.pattern:
        argv += ["--layer-types", ",".join(LAYER_LETTERS[c] for c in spec.pattern)]
    if spec.window is not None:
        argv += ["--sliding-window", str(spec.window)]
    if spec.target_layers:
        argv += ["--target-layer-ids", ",".join(map(str, spec.target_layers))]
    return argv


def comparisons(group: list[Spec], target: str) -> list[tuple[str, str, str]]:
    """The paired comparisons in a group, as (baseline key, drafter key, what): DFlash 2 (and its variants)
    against DFlash 1 of the same block, pattern and text (variants also against DFlash 2); a layer pattern
    against the drafters of the same block, arch and text without one, whatever their depth (when trained); regenerated-text drafters against the
    original-text ones of the same spec."""
    pairs = []
    for s in group:
        for base in ("dflash", "dflash2"):
            if s.arch not in (None, "dflash", base):
                pairs.append(
                    (key_of(s._replace(arch=base), target), key_of(s, target), f"{s.arch}_over_{base}")
                )
        if s.pattern:
            plain = [x for x in group if x._replace(layers=s.layers, pattern=s.pattern, window=s.window) == s
                     and x.pattern is None]  # fmt: skip
            pairs += [
                (key_of(x, target), key_of(s, target), f"{s.pattern}_over_{x.layers}_full") for x in plain
            ]
        if s.seed is not None and s._replace(seed=None) in group:
            pairs.append(
                (key_of(s._replace(seed=None), target), key_of(s, target), f"s{s.seed}_over_run_seed")
            )
        if s.target_layers and s._replace(target_layers=None) in group:
            what = f"{_layers_tag(s)}_over_default_layers"
            pairs.append((key_of(s._replace(target_layers=None), target), key_of(s, target), what))
        if s.text == "regenerated":
            pairs.append(
                (key_of(s._replace(text="original"), target), key_of(s, target), "regenerated_over_original")
            )
    return pairs


def capture_pairs(specs: list[Spec], target: str) -> list[tuple[str, str]]:
    """(bf16-captured key, FP8-captured key) for every ``@fp8`` spec (its twin: the same spec, bf16 capture)."""
    return [
        (key_of(s._replace(capture=None), target), key_of(s, target)) for s in specs if s.capture == "fp8"
    ]


def served_fp8(specs: list[Spec], every: bool) -> list[Spec]:
    """The drafters also evaluated against the FP8 target: both of every capture pair, or (``every``) all."""
    pairs = {s._replace(capture=None) for s in specs if s.capture == "fp8"}
    return [s for s in specs if every or s.capture == "fp8" or s in pairs]
