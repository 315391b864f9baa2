"""Text-only loading of a hybrid target's checkpoint: only the tensors the capture runs are read.

Qwen3.5 / Qwen3.6 checkpoints are multimodal (``Qwen3_5ForConditionalGeneration``): the text model under
``model.language_model.*``, a vision tower under ``model.visual.*`` and an MTP head under ``mtp.*``.
``load_text_model(path, text_config, device, dtype)`` builds the text-only causal LM
(``AutoModelForCausalLM.from_config(text_config)``: ``Qwen3_5ForCausalLM`` / ``Qwen3_5MoeForCausalLM``) with
the (possibly cut) text config (under transformers' ``no_init_weights``: no random initialisation of
tensors about to be overwritten, which at 27B costs seconds even on the GPU), then fills each of its tensors
from the safetensors files by name (stored as the model holds them: ``raw_read.ParallelRead``, several threads;
else ``safe_open(...).get_tensor(key)`` and a copy): ``model.X`` from ``model.language_model.X`` (multimodal layout) or
``model.X`` (text layout), ``lm_head.weight`` as is. Nothing else is read: not the vision tower, not the
MTP head, not the decoder layers past the config's ``num_hidden_layers``. Per-expert MoE tensors
(``mlp.experts.E.{gate,up,down}_proj.weight``, how transformers saves them) are stacked into the fused
``experts.gate_up_proj`` (gate rows, then up rows) / ``experts.down_proj`` parameters.
A tensor the model needs and the checkpoint lacks, or one of another shape, is a ValueError naming it.

FP8 checkpoints (Qwen's block-128 layout, ``fp8_config``; ``target_dtype`` = ``--target-dtype``): with fp8
(the default for them) each linear layer whose checkpoint weight is float8_e4m3fn becomes an
``fp8.Fp8Linear`` read as stored (weight and ``weight_scale_inv``, no bf16 copy), its scale checked first (a
missing one, or one of another shape or dtype, is a ValueError naming it); the layers listed in
``modules_to_not_convert`` and every other tensor stay in the model's dtype (an FP8 one among them, e.g.
stacked MoE experts, dequantised on read). With bf16 every FP8 weight is dequantised on read. A bf16
checkpoint with fp8 is quantised on load (``fp8.quantise_model``). ``fp8_scales`` (``--fp8-scales``; None:
block): with "row" the FP8 layers run rowwise, a bf16 checkpoint quantised per row and an FP8 one read as
stored, then requantised per row layer by layer (``fp8.to_row_scales``); refused with a bf16 target dtype.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass

import torch
from safetensors import safe_open
from torch import nn

from trainer.drafting.head import weight_map
from trainer.run.fp8_config import Fp8Config, read_dir
from trainer.target import fp8
from trainer.target.raw_read import Entry, ParallelRead, header


def weight_files_bytes(path: str) -> int:
    """The size of the target's safetensors files (what a full read of its weights reads)."""
    try:
        return sum(
            os.path.getsize(os.path.join(path, fn)) for fn in os.listdir(path) if fn.endswith(".safetensors")
        )
    except OSError:
        return 0


class _Reader:
    """Reads named tensors, keeping one open handle per file."""

    def __init__(self, path: str, keys: dict[str, str]):
        self.path, self.keys, self.handles = path, keys, {}

    def get(self, key: str) -> torch.Tensor:
        fn = self.keys[key]
        if fn not in self.handles:
            self.handles[fn] = safe_open(os.path.join(self.path, fn), framework="pt", device="cpu")
        return self.handles[fn].get_tensor(key)

    def close(self) -> None:
        for h in self.handles.values():
            close = getattr(h, "__exit__", None)
            if close is not None:
                close(None, None, None)
        self.handles.clear()


_FUSED = re.compile(r"^(.*\.mlp\.experts)\.(gate_up_proj|down_proj)$")


def _source(name: str, keys: dict[str, str]) -> str | None:
    cands = [name]
    if name.startswith("model."):
        cands.insert(0, "model.language_model." + name[len("model.") :])
    return next((c for c in cands if c in keys), None)


def _value(src: str, read: _Reader) -> torch.Tensor:
    """The tensor ``src`` as its real values: an FP8 weight dequantised with its checked block scales."""
    t = read.get(src)
    if t.dtype not in fp8.FP8_DTYPES:
        return t
    key = fp8.scale_key(src)
    if t.dtype != fp8.E4M3 or key not in read.keys:
        raise ValueError(_fp8_refusal(src, t.dtype, key))
    s = read.get(key)
    fp8.check_scale(key, s.dtype, s.shape, t.shape)
    return fp8.dequantise(t, s)


def _fp8_refusal(src: str, dtype, key: str) -> str:
    if dtype != fp8.E4M3:
        return f"{src}: dtype {dtype}; FP8 checkpoints are read in e4m3 (float8_e4m3fn) only"
    return f"{src} is float8_e4m3fn but the checkpoint has no {key} (its per-block scales)"


def _fetch(name: str, shape: torch.Size, keys: dict[str, str], read: _Reader) -> torch.Tensor:
    src = _source(name, keys)
    if src is not None:
        return _value(src, read)
    m = _FUSED.match(name)
    if m is not None:  # per-expert tensors stacked into the fused parameter
        prefix = m.group(1)
        n = shape[0]
        per = []
        for e in range(n):
            parts = ("gate_proj", "up_proj") if m.group(2) == "gate_up_proj" else ("down_proj",)
            got = []
            for p in parts:
                src = _source(f"{prefix}.{e}.{p}.weight", keys)
                if src is None:
                    raise ValueError(f"the checkpoint has no tensor for {name} (expert {e} {p})")
                got.append(_value(src, read))
            per.append(torch.cat(got, dim=0))
        return torch.stack(per)
    raise ValueError(f"the checkpoint has no tensor for {name}")


class _StagedCopy:
    """Host tensors into GPU tensors through two pinned staging buffers: the CPU fills one (a multi-threaded
    memcpy out of the memory-mapped file) while the GPU's DMA drains the other. A plain ``copy_`` from
    pageable memory went at ~2.7 GB/s on an H200 (16 GB of an 8B target in ~6 s). Same-dtype, contiguous
    pairs only; anything else (a cast, a CPU model) is a plain ``copy_``."""

    CHUNK = 64 << 20

    def __init__(self, device: torch.device):
        self.device = device
        self.bufs = [torch.empty(self.CHUNK, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
        self.done: list = [None, None]
        self.i = 0

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        if src.dtype != dst.dtype or not (dst.is_contiguous() and src.is_contiguous()) or dst.numel() == 0:
            dst.copy_(src)
            return
        s, d = src.reshape(-1).view(torch.uint8), dst.view(-1).view(torch.uint8)
        for off in range(0, s.numel(), self.CHUNK):
            n = min(self.CHUNK, s.numel() - off)
            i, self.i = self.i, self.i ^ 1
            if self.done[i] is not None:  # the DMA out of this buffer has finished
                self.done[i].synchronize()
            self.bufs[i][:n].copy_(s[off : off + n])
            d[off : off + n].copy_(self.bufs[i][:n], non_blocking=True)
            self.done[i] = torch.cuda.Event()
            self.done[i].record()

    def finish(self) -> None:
        torch.cuda.current_stream(self.device).synchronize()


def _no_init():
    """transformers' context that skips weight initialisation (a no-op context where it is missing)."""
    try:
        from transformers.initialization import no_init_weights
    except ImportError:
        try:
            from transformers.modeling_utils import no_init_weights
        except ImportError:
            return contextlib.nullcontext()
    return no_init_weights()


def _entry(path: str, keys: dict[str, str], heads: dict[str, dict[str, Entry]], src: str) -> Entry | None:
    """The header entry of checkpoint tensor ``src`` (each file's header parsed once, into ``heads``)."""
    fn = keys[src]
    if fn not in heads:
        heads[fn] = header(os.path.join(path, fn))
    return heads[fn].get(src)


def _fp8_linears(model: nn.Module, path: str, keys: dict[str, str], heads: dict, cfg: Fp8Config) -> list[str]:
    """The model's ``nn.Linear`` layers whose checkpoint weight is FP8 and not listed in
    ``modules_to_not_convert`` (a listed one stays a bf16 layer, its weight dequantised), each with its
    ``weight_scale_inv`` checked: a missing one, or one of another shape or dtype, is a ValueError naming it."""
    names = []
    for name, mod in model.named_modules():
        src = _source(name + ".weight", keys) if type(mod) is nn.Linear else None
        e = None if src is None else _entry(path, keys, heads, src)
        if e is None or e.dtype not in fp8.FP8_DTYPES or not cfg.converts(name, src.removesuffix(".weight")):
            continue
        key, shape = fp8.scale_key(src), (mod.out_features, mod.in_features)
        if e.dtype != fp8.E4M3 or key not in keys:
            raise ValueError(_fp8_refusal(src, e.dtype, key))
        if e.shape != shape:
            raise ValueError(f"{name}.weight: checkpoint shape {e.shape}, model {shape}")
        s = _entry(path, keys, heads, key)
        fp8.check_scale(key, s.dtype, s.shape, shape)
        names.append(name)
    return names


def load_text_model(
    path: str,
    text_config,
    device: str | torch.device,
    dtype: torch.dtype,
    progress=None,
    target_dtype: str | None = None,
    fp8_scales: str | None = None,
) -> nn.Module:
    """``progress(done, total)``: bytes filled into the model's tensors so far, of all of them.
    ``target_dtype`` (``--target-dtype``; ``fp8.wants_fp8``, None: fp8 for an FP8 checkpoint): with fp8 the
    checkpoint's FP8 linear layers become ``fp8.Fp8Linear`` filled as stored (a bf16 checkpoint's are
    quantised on load); with bf16 an FP8 checkpoint's weights are dequantised into the model's dtype.
    ``fp8_scales`` (``--fp8-scales``): "block" (None) or "row" (module docstring)."""
    return build_text_model(path, text_config, device, dtype, target_dtype, fp8_scales).fill(progress)


@dataclass
class BuiltModel:
    """A text model built (its tensors allocated, not read yet) by ``build_text_model``; ``fill`` reads them.

    Split because building touches process-wide state: transformers sets torch's default dtype and swaps its
    init functions while it builds, and torch.compile saves and restores that default dtype around every frame
    it compiles, in whichever thread. A build in a thread beside a compile can come out with some layers in
    fp32 (seen on an H200: a dense target's compiled layer step fed an fp32 norm into a bf16 projection). So
    the trainer builds on its own thread and reads the weights (which touches no such state) beside the
    drafter's compile."""

    model: nn.Module
    path: str
    text_config: object
    device: str | torch.device
    keys: dict
    heads: dict
    quantise_after: bool
    fp8_scales: str = "block"  # "row": the FP8 layers made rowwise once read (fp8.to_row_scales)

    def fill(self, progress=None) -> nn.Module:
        model, tied = self.model, bool(getattr(self.text_config, "tie_word_embeddings", False))
        _fill(model, self.path, self.keys, self.heads, torch.device(self.device), tied, progress)
        if tied:
            model.tie_weights()
        if self.quantise_after:
            fp8.quantise_model(model, self.fp8_scales)
        elif self.fp8_scales == "row":
            fp8.to_row_scales(model)
        return model


def build_text_model(
    path: str,
    text_config,
    device: str | torch.device,
    dtype: torch.dtype,
    target_dtype: str | None = None,
    fp8_scales: str | None = None,
) -> BuiltModel:
    """The model of ``load_text_model`` built on ``device`` without initialising (FP8 layers swapped in where
    the checkpoint has them); call on the thread that compiles, or with nothing compiling beside it."""
    from transformers import AutoModelForCausalLM

    keys = weight_map(path)
    cfg = read_dir(path)
    use_fp8 = fp8.wants_fp8(target_dtype, cfg is not None, device)
    scales = fp8.scales_for(fp8_scales, use_fp8)
    with torch.device(device), _no_init():  # every tensor is read below: no random init first
        model = AutoModelForCausalLM.from_config(text_config, dtype=dtype)
    heads: dict[str, dict[str, Entry]] = {}
    if use_fp8 and cfg is not None:
        fp8.swap(model, _fp8_linears(model, path, keys, heads, cfg))
    return BuiltModel(model, path, text_config, device, keys, heads, use_fp8 and cfg is None, scales)


def _fill(
    model: nn.Module, path: str, keys: dict, heads: dict, dev: torch.device, tied: bool, progress
) -> None:
    """Every tensor of the model (but a tied lm_head) from the checkpoint, with byte progress."""
    read = _Reader(path, keys)
    todo = [
        (n, t) for n, t in model.state_dict(keep_vars=True).items() if not (tied and n == "lm_head.weight")
    ]
    total, done = sum(t.numel() * t.element_size() for _, t in todo), 0
    # tensors stored as the model holds them: read by several threads straight from the files (raw_read);
    # the rest (a cast, stacked experts, a dtype raw_read does not know) through safetensors, one by one
    raw, rest = ParallelRead(dev), []
    for name, t in todo:
        src = _source(name, keys)
        if src is not None:
            fn = keys[src]
            e = _entry(path, keys, heads, src)
            if e is not None and e.dtype == t.dtype and e.shape == tuple(t.shape) and t.is_contiguous():
                raw.add(os.path.join(path, fn), src, e, t)
                continue
        rest.append((name, t))
    staged = _StagedCopy(dev) if dev.type == "cuda" and rest else None
    try:
        with torch.no_grad(), torch.cuda.device(dev) if staged else contextlib.nullcontext():
            for name, t in rest:
                src = _fetch(name, t.shape, keys, read)
                if tuple(src.shape) != tuple(t.shape):
                    raise ValueError(f"{name}: checkpoint shape {tuple(src.shape)}, model {tuple(t.shape)}")
                if staged is not None:
                    staged.copy(t, src)
                else:
                    t.copy_(src)
                done += t.numel() * t.element_size()
                if progress is not None:
                    progress(done, total)
            if staged is not None:
                staged.finish()
    finally:
        read.close()
    with torch.no_grad():
        raw.run(None if progress is None else lambda d, _t: progress(done + d, total))
