"""bench_acceptance.py's targets: small byte-level causal LMs, built, trained from scratch and saved here.

Two families (``--target-arch``), one vocabulary (bytes 0-255, ``<eos>`` 256, the drafter's mask 257; 260 ids):
- ``qwen3``: a dense Qwen3 (``Qwen3ForCausalLM``), the bench's target since issue 15;
- ``qwen3_5``: a hybrid Qwen3.5-family text model (``Qwen3_5ForCausalLM``, model_type ``qwen3_5_text``):
  repeats of (3 Gated DeltaNet + 1 gated full attention), partial rotary 0.25, output gate, more value than
  key heads in the linear layers (the Qwen3.6-27B layout, scaled down).

Shapes (``--target-shape``): ``d512`` (hidden 512, 8 layers: the dense bench's own; dense only) and ``h384``
(hidden 384, 8 layers, MLP 1,152: the hybrid's, and the dense target of the same width and depth for the
issue-35 comparison). ``--small`` / ``--tiny`` narrow both (hidden 128 / 64): ``d512`` to the dense bench's
earlier 4-layer CPU shapes, ``h384`` keeping 8 layers, so that the two archs share width and depth there too.

Training: AdamW 1e-3 with 50 warm-up steps and a cosine, bf16 autocast on CUDA, batches of random
512-byte windows of the training bytes. A hybrid trains through transformers' plain PyTorch Gated DeltaNet
functions even where flash-linear-attention is installed (``torch_linear_path``: fla 0.6's gated-delta
backward refuses on Hopper with Triton 3.6, its issue 640); the frozen target then runs as saved (fla's
forward on a GPU for the trainer's capture and ``trainer.evaluate``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import math
import time

EOS, MASK, VOCAB = 256, 257, 260
TARGET_ARCHS = ("qwen3", "qwen3_5")
SHAPES = ("d512", "h384")
DEFAULT_SHAPE = {"qwen3": "d512", "qwen3_5": "h384"}
SEQ = 512  # bytes a training window (the drafters' chunks too)

_LINEAR_H384 = dict(lin_k_heads=4, lin_v_heads=8, lin_k_dim=48, lin_v_dim=48)
# --small / --tiny: d512 keeps the dense bench's earlier small shapes (4 layers); h384 keeps the hybrid's
# depth and pattern (8 layers, 2 x (3 + 1); so the trainer's default target layers are those of the full size)
_SMALL = dict(hidden=128, heads=4, kv=2, head_dim=32, inter=384)
_TINY = dict(hidden=64, heads=4, kv=2, head_dim=16, inter=128)
DIMS = {
    "full": {
        "d512": dict(hidden=512, layers=8, heads=8, kv=4, head_dim=64, inter=1536),
        "h384": dict(hidden=384, layers=8, heads=6, kv=2, head_dim=64, inter=1152, **_LINEAR_H384),
    },
    "small": {
        "d512": dict(_SMALL, layers=4),
        "h384": dict(_SMALL, layers=8, lin_k_heads=2, lin_v_heads=4, lin_k_dim=32, lin_v_dim=32),
    },
    "tiny": {
        "d512": dict(_TINY, layers=4),
        "h384": dict(_TINY, layers=8, lin_k_heads=2, lin_v_heads=4, lin_k_dim=16, lin_v_dim=16),
    },
}
# the functions transformers' Qwen3.5 Gated DeltaNet calls by their module-level names (5.17 and 5.24): each
# wrapped at import by ``use_kernel_func_from_hub_with_fallback``, which binds fla / causal-conv1d when installed
LINEAR_FUNCTIONS = (
    "torch_chunk_gated_delta_rule",
    "torch_recurrent_gated_delta_rule",
    "causal_conv1d_fn",
    "causal_conv1d_update",
)


def resolve_shape(arch: str, shape: str | None) -> str:
    """``--target-shape`` for ``--target-arch`` (None: the arch's default); a hybrid has only ``h384``."""
    if arch not in TARGET_ARCHS:
        raise ValueError(f"--target-arch: {arch!r} is not one of {', '.join(TARGET_ARCHS)}")
    shape = shape or DEFAULT_SHAPE[arch]
    if shape not in SHAPES:
        raise ValueError(f"--target-shape: {shape!r} is not one of {', '.join(SHAPES)}")
    if arch == "qwen3_5" and shape != "h384":
        raise ValueError(f"--target-shape {shape}: the qwen3_5 target has only the h384 shape")
    return shape


def target_dims(size: str, arch: str, shape: str | None = None) -> dict:
    """The target's dimensions at bench size ``size`` (full, small, tiny), with its arch and shape."""
    shape = resolve_shape(arch, shape)
    return {"arch": arch, "shape": shape, **DIMS[size][shape]}


def target_tag(dims: dict) -> str:
    """The target's name in results keys and file names: ``qwen3_d512``, ``qwen3_h384``, ``qwen3_5_h384``."""
    return f"{dims['arch']}_{dims['shape']}"


def layer_types(layers: int) -> list[str]:
    """The hybrid's layer pattern: every fourth layer full attention, the others Gated DeltaNet."""
    return ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(layers)]


def target_config(dims: dict):
    """The transformers config of a target of ``dims`` (``target_dims``)."""
    common = dict(vocab_size=VOCAB, hidden_size=dims["hidden"], intermediate_size=dims["inter"],
                  num_hidden_layers=dims["layers"], num_attention_heads=dims["heads"],
                  num_key_value_heads=dims["kv"], head_dim=dims["head_dim"], max_position_embeddings=4096,
                  tie_word_embeddings=False, eos_token_id=EOS, bos_token_id=None, pad_token_id=None)  # fmt: skip
    if dims["arch"] == "qwen3":
        from transformers import Qwen3Config

        cfg = Qwen3Config(rope_theta=10000.0, **common)
    else:
        from transformers import Qwen3_5TextConfig

        freqs = int(dims["head_dim"] * 0.25) // 2  # rotary frequencies; text positions: mrope = plain rope
        section = [freqs - 2 * (freqs // 3), freqs // 3, freqs // 3]
        cfg = Qwen3_5TextConfig(
            layer_types=layer_types(dims["layers"]), linear_num_key_heads=dims["lin_k_heads"],
            linear_num_value_heads=dims["lin_v_heads"], linear_key_head_dim=dims["lin_k_dim"],
            linear_value_head_dim=dims["lin_v_dim"], linear_conv_kernel_dim=4,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                             "mrope_interleaved": True, "mrope_section": section}, **common)  # fmt: skip
    cfg._attn_implementation = "sdpa"
    return cfg


def build_target(dims: dict, device: str, seed: int):
    """A freshly initialised target of ``dims`` on ``device`` (fp32 weights)."""
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cls = Qwen3ForCausalLM if dims["arch"] == "qwen3" else Qwen3_5ForCausalLM
    return cls(target_config(dims)).to(device)


@contextlib.contextmanager
def torch_linear_path(module=None):
    """While inside, transformers' Qwen3.5 Gated DeltaNet runs its plain PyTorch functions whatever kernels
    its import bound (fla's ``chunk_gated_delta_rule``, causal-conv1d): each module-level function in
    ``LINEAR_FUNCTIONS`` is swapped for the torch function it wraps (``inspect.unwrap``), and put back on exit.
    ``module``: the modeling module (default: ``transformers.models.qwen3_5.modeling_qwen3_5``). A module
    without those names (another transformers layout) is refused rather than trained through unknown
    kernels."""
    if module is None:
        from transformers.models.qwen3_5 import modeling_qwen3_5 as module
    missing = [n for n in LINEAR_FUNCTIONS if not callable(getattr(module, n, None))]
    if missing:
        raise RuntimeError(
            f"{module.__name__} has no {', '.join(missing)}: this transformers lays out its Gated DeltaNet "
            "kernels differently; the bench cannot force its PyTorch path for training"
        )
    saved = {n: getattr(module, n) for n in LINEAR_FUNCTIONS}
    try:
        for name, fn in saved.items():
            setattr(module, name, inspect.unwrap(fn))
        yield
    finally:
        for name, fn in saved.items():
            setattr(module, name, fn)


def linear_kernels_as_saved() -> str:
    """What a frozen hybrid's chunked gated delta rule runs in this environment: ``fla`` when the package
    imports (transformers binds it), else ``torch``."""
    return "fla" if importlib.util.find_spec("fla") is not None else "torch"


def lr_at(step: int, steps: int) -> float:
    return 1e-3 * min(1.0, (step + 1) / 50) * 0.5 * (1 + math.cos(math.pi * step / steps))


def train_loop(model, train: bytes, steps: int, batch: int, device: str, seed: int) -> tuple[list, float]:
    """``steps`` AdamW steps on random ``SEQ``-byte windows of ``train``; (the loss every 100 steps, seconds)."""
    import numpy as np
    import torch

    data = torch.from_numpy(np.frombuffer(train, dtype=np.uint8).astype(np.int64))
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, betas=(0.9, 0.95))
    cuda = device.startswith("cuda")
    t0, losses = time.monotonic(), []
    for step in range(steps):
        for gr in opt.param_groups:
            gr["lr"] = lr_at(step, steps)
        idx = torch.randint(0, len(data) - SEQ - 1, (batch,), generator=g)
        x = data[idx.unsqueeze(1) + torch.arange(SEQ)].to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 100 == 0 or step == steps - 1:
            losses.append((step, float(loss.detach())))
            print(
                f"target step {step}/{steps} loss {losses[-1][1]:.3f} ({time.monotonic() - t0:.0f}s)",
                flush=True,
            )
    return losses, time.monotonic() - t0


def heldout_accuracy(model, held: list[list[int]], device: str) -> float:
    """Greedy next-byte accuracy of ``model`` on the held-out chunks ``held`` (in the model's own dtype)."""
    import torch

    correct = total = 0
    with torch.no_grad():
        for i in range(0, len(held), 16):
            x = torch.tensor(held[i : i + 16], device=device)
            pred = model(input_ids=x).logits.argmax(-1)
            correct += int((pred[:, :-1] == x[:, 1:]).sum())
            total += x[:, 1:].numel()
    return correct / total


def saved_accuracy(target_dir: str, held: list[list[int]], device: str) -> float:
    """``heldout_accuracy`` of the saved target at ``target_dir`` as the bench's tools load it (bf16 on CUDA,
    fp32 on the CPU; a hybrid through the kernels its import binds)."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=dtype).to(device).eval()
    try:
        return heldout_accuracy(model, held, device)
    finally:
        del model


def train_target(
    dims: dict, sched: dict, train: bytes, held: list[list[int]], out_dir: str, seed: int
) -> dict:
    """Build, train (``sched``: steps, batch, device) and save a target of ``dims`` to ``out_dir`` as a
    transformers directory (bf16 on CUDA, fp32 on the CPU) with the byte tokenizer; its facts for results.json.
    A hybrid trains (and is scored in fp32) through ``torch_linear_path``; ``heldout_next_byte_accuracy_as_saved``
    is the saved weights' score through the kernels the frozen target runs on."""
    import torch

    from bench import regen_text

    dev = sched["device"]
    model = build_target(dims, dev, seed)
    hybrid = dims["arch"] == "qwen3_5"
    forced = torch_linear_path() if hybrid else contextlib.nullcontext()
    with forced:
        losses, seconds = train_loop(model, train, sched["steps"], sched["batch"], dev, seed)
        model.eval()
        acc = heldout_accuracy(model, held, dev)
    model.to(torch.bfloat16 if dev.startswith("cuda") else torch.float32)
    facts = {"arch": dims["arch"], "shape": dims["shape"], "dims": dims, "steps": sched["steps"],
             "batch": sched["batch"], "seq": SEQ, "train_seconds": seconds, "loss_curve": losses,
             "heldout_next_byte_accuracy": acc, "params": sum(p.numel() for p in model.parameters()),
             "model_type": model.config.model_type}  # fmt: skip
    if hybrid:
        facts["linear_kernels"] = {"training": "torch", "as_saved": linear_kernels_as_saved()}
        facts["heldout_next_byte_accuracy_as_saved"] = heldout_accuracy(model, held, dev)
    model.save_pretrained(out_dir)
    regen_text.save_byte_tokenizer(out_dir)  # what trainer.regenerate / trainer.prepare load (ids = bytes)
    return facts
