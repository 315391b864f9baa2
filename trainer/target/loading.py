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
"""

from __future__ import annotations

import contextlib
import os
import re

import torch
from safetensors import safe_open
from torch import nn

from trainer.drafting.head import weight_map
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


def _fetch(name: str, shape: torch.Size, keys: dict[str, str], read: _Reader) -> torch.Tensor:
    src = _source(name, keys)
    if src is not None:
        return read.get(src)
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
                got.append(read.get(src))
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


def load_text_model(
    path: str, text_config, device: str | torch.device, dtype: torch.dtype, progress=None
) -> nn.Module:
    """``progress(done, total)``: bytes filled into the model's tensors so far, of all of them."""
    from transformers import AutoModelForCausalLM

    keys = weight_map(path)
    with torch.device(device), _no_init():  # every tensor is read below: no random init first
        model = AutoModelForCausalLM.from_config(text_config, dtype=dtype)
    tied = bool(getattr(text_config, "tie_word_embeddings", False))
    read = _Reader(path, keys)
    todo = [
        (n, t) for n, t in model.state_dict(keep_vars=True).items() if not (tied and n == "lm_head.weight")
    ]
    total, done = sum(t.numel() * t.element_size() for _, t in todo), 0
    dev = torch.device(device)
    # tensors stored as the model holds them: read by several threads straight from the files (raw_read);
    # the rest (a cast, stacked experts, a dtype raw_read does not know) through safetensors, one by one
    raw, rest = ParallelRead(dev), []
    heads: dict[str, dict[str, Entry]] = {}
    for name, t in todo:
        src = _source(name, keys)
        if src is not None:
            fn = keys[src]
            if fn not in heads:
                heads[fn] = header(os.path.join(path, fn))
            e = heads[fn].get(src)
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
    if tied:
        model.tie_weights()
    return model
