"""Hybrid target capture (Qwen3.6-27B text shape, random weights built on the GPU): tok/s, TFLOP/s, correctness.

    PYTHONPATH=. python bench/bench_hybrid.py --out $OUT            # one H200, flash-linear-attention installed
    PYTHONPATH=. python bench/bench_hybrid.py --tiny --out /tmp/bh  # CPU smoke run (tiny shape, eager)

The shape is /work/shared/targets/qwen3.6-27b-text.json's (64 layers, 3 Gated DeltaNet : 1 gated attention,
hidden 5120, 16 key / 48 value heads of 128, 24 q / 4 kv heads of 256, vocab 248,320); captured layers
[1, 16, 31, 46, 61] (62 layers run), or all 64 + the final norm with soft labels. 49,152 tokens per call:
``packed`` = one row of documents of 1,024-8,192 tokens, ``single`` = 6 rows of 8,192 (one document each).
Steps (in this order, each written to OUT/bench_hybrid.json as it ends; a step is skipped when the time
budget ``--budget-s`` would be passed):
- ``conv``: the per-document conv of one Gated DeltaNet layer at this token count, the reference (shifted
  taps, compiled) against ``doc_conv``'s Triton kernel, with its byte floor (``bench/hybrid_conv.py``);
- ``direct_packed``, ``direct_single``: the fast hybrid path (``prepare_hybrid(fast=True)``: compiled regions,
  fla's varlen kernels); ``direct_packed_soft``: the same with ``need_final_hidden`` (64 layers);
- ``hooks_single``: transformers' forward with hooks (the reference; it refuses packed rows), and the
  relative error of ``direct_single`` against it per captured layer;
- ``packed_vs_alone``: each document of the packed row captured alone by the hook path against its slice
  of ``direct_packed`` (relative L2 error per document, per captured layer);
- ``profile``: GPU time by kernel class over one ``direct_packed`` call;
- then the same model quantised to FP8 in place (``bench/hybrid_fp8.py``), when an FP8 step is asked for, in
  both scalings from the same bf16 weights: block-128 e4m3 weights with 1 x 128 activation groups (the
  ``dflash::fp8_block_mm`` op) and one scale per weight row and per token (``dflash::fp8_row_mm``), each
  compiled with the activation quantisation fused (on the CPU the dequantised weights). Block first:
  ``fp8_packed`` (as ``direct_packed``, with its error per captured layer against ``direct_packed``'s bf16
  output), ``fp8_packed_vs_alone`` (as ``packed_vs_alone_direct``), ``fp8_profile`` (as ``profile``); then
  the rowwise set swapped in: ``fp8row_packed``, ``fp8row_packed_vs_alone``, ``fp8row_profile`` the same;
  the summary's ``fp8_vs_bf16`` / ``fp8row_vs_bf16``: each rate against bf16's, the ratio, the goal;
- ``accuracy_fp32``: the first 4 layers against an fp32 reference, bf16 and FP8 block, row and row converted
  from block (``accuracy_fp32``).
FLOPs: the projections and MLP of each layer (2 x params x tokens) plus full attention's QK/PV under the
document-causal mask; the Gated DeltaNet recurrence and the conv are not counted (they are not matmuls of the
weights). ``mfu_measured`` is against the bf16 8192^3 matmul rate measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import hybrid_fp8  # noqa: E402
from bench.bench_target import packed_docs, raise_compile_limits  # noqa: E402
from bench.flops import causal_pairs, measure_matmul_tflops, rates  # noqa: E402
from bench.hybrid_conv import conv_step  # noqa: E402
from bench.hybrid_report import print_summary  # noqa: E402
from bench.prof import profile, timed  # noqa: E402
from trainer.target.base import attach  # noqa: E402
from trainer.target.capture import capture  # noqa: E402
from trainer.target.hybrid import prepare_hybrid  # noqa: E402

LAYERS = [1, 16, 31, 46, 61]
STEPS = (
    "conv",
    "direct_packed",
    "direct_single",
    "hooks_single",
    "packed_vs_alone",
    "packed_vs_alone_direct",
    "direct_packed_soft",
    "profile",
    "fp8_packed",
    "fp8_packed_vs_alone",
    "fp8_profile",
    "fp8row_packed",
    "fp8row_packed_vs_alone",
    "fp8row_profile",
    "accuracy_fp32",
)
FP8_TAGS = {"fp8": "block", "fp8row": "row"}  # the FP8 steps' prefixes and their scales
FP8_STEPS = tuple(f"{t}_{s}" for t in FP8_TAGS for s in ("packed", "packed_vs_alone", "profile"))
ACC_LENS = (3000, 1, 3, 64, 1900, 3224)  # accuracy_fp32's packed row: 1 token, < conv width, one chunk, long


def text_config(tiny: bool):
    from transformers import Qwen3_5TextConfig

    if tiny:
        from trainer.data.tiny_build import hybrid_text_config

        return Qwen3_5TextConfig(**hybrid_text_config(False))
    return Qwen3_5TextConfig(
        hidden_size=5120,
        intermediate_size=17408,
        num_hidden_layers=64,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 16,
        full_attention_interval=4,
        num_attention_heads=24,
        num_key_value_heads=4,
        head_dim=256,
        attn_output_gate=True,
        linear_num_key_heads=16,
        linear_num_value_heads=48,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
        rms_norm_eps=1e-6,
        vocab_size=248320,
        max_position_embeddings=262144,
        tie_word_embeddings=False,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10_000_000.0,
            "partial_rotary_factor": 0.25,
            "mrope_interleaved": True,
            "mrope_section": [11, 11, 10],
        },
    )


def build(tiny: bool, device: str):
    """The text causal LM, built and initialised on ``device`` (bf16 there on CUDA), never through a CPU copy."""
    from transformers import AutoModelForCausalLM

    cfg = text_config(tiny)
    cfg._attn_implementation = "sdpa"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    finally:
        torch.set_default_dtype(old)
    with torch.no_grad():  # slow decay (a trained model's long memory): state leaks between documents show
        for name, p in model.named_parameters():
            if name.endswith("linear_attn.A_log"):
                p.copy_(torch.empty_like(p, dtype=torch.float32).uniform_(0.005, 0.1).log())
    return model.eval().requires_grad_(False), cfg


def flops_per_call(cfg, n_layers: int, tokens: int, pairs: int) -> int:
    H, inter = cfg.hidden_size, cfg.intermediate_size
    kd = cfg.linear_num_key_heads * cfg.linear_key_head_dim
    vd = cfg.linear_num_value_heads * cfg.linear_value_head_dim
    lin = H * (2 * kd + vd) + H * vd + 2 * H * cfg.linear_num_value_heads + vd * H
    qd, kvd = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    att = H * 2 * qd + 2 * H * kvd + qd * H
    mlp = 3 * H * inter
    total = 0
    for i in range(n_layers):
        full = cfg.layer_types[i] == "full_attention"
        total += 2 * ((att if full else lin) + mlp) * tokens
        if full:
            total += 4 * cfg.num_attention_heads * cfg.head_dim * pairs
    return total


rel = hybrid_fp8.rel


def vs_alone(entry: dict, model, ids, got, lens, layers, H: int, left, doc_device="cpu") -> None:
    """Each document of the packed row ``got`` (captured features) against that document captured alone by
    the model's current capture path (document ids on ``doc_device``): relative error in all and per captured
    layer, into ``entry``."""
    s = 0
    for n in lens:
        if left() < 30:
            entry["cut"] = "time budget"
            break
        alone = capture(
            model, ids[:, s : s + n], torch.zeros(1, n, dtype=torch.long, device=doc_device), layers
        )[0]
        piece = got[:, s : s + n]
        by_layer = [
            rel(piece[..., k * H : (k + 1) * H], alone[..., k * H : (k + 1) * H]) for k in range(len(layers))
        ]
        entry["docs"].append({"start": s, "len": n, "rel_err": rel(piece, alone), "by_layer": by_layer})
        s += n
    errs = [d["rel_err"] for d in entry["docs"]]
    entry["max_rel_err"] = max(errs) if errs else None


def accuracy_fp32(tiny: bool, device: str, with_fp8: bool = True) -> dict:
    """The first 4 layers (3 Gated DeltaNet, 1 attention) at the exact layer shape in fp32: the issue-14 path in
    plain PyTorch (fp32, dense document mask) is the reference; then in bf16: transformers (hooks, one-document
    row), the fast path (eager) and the issue-14 path, one-document and packed (ACC_LENS) rows; then
    (``with_fp8``) the bf16 model quantised to FP8 (block, row, row converted from block), the fast path
    (eager), against the reference and against the bf16 fast path (``hybrid_fp8.fp8_columns``). Relative L2 error per layer (packed: over the whole row;
    every document starts from zero state in the reference)."""
    cfg = text_config(tiny)
    cfg.num_hidden_layers = 4
    cfg.layer_types = cfg.layer_types[:4]
    cfg._attn_implementation = "sdpa"
    from transformers import AutoModelForCausalLM

    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("linear_attn.A_log"):
                p.copy_(torch.empty_like(p).uniform_(0.005, 0.1).log())
    model.eval().requires_grad_(False)
    lens = (40, 1, 3, 10, 42) if tiny else ACC_LENS
    T = sum(lens)
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, cfg.vocab_size - 1, (1, T), generator=g).to(device)
    rows = {
        "single": torch.zeros(1, T, dtype=torch.long),
        "packed": torch.cat([torch.full((n,), i) for i, n in enumerate(lens)]).view(1, T),
    }
    layers = [0, 1, 2, 3]
    ref = {}
    prepare_hybrid(model, attn="sdpa", linear="torch", fast=False)
    for k, d in rows.items():
        ref[k] = capture(model, ids, d.to(device), layers)[0]
    model.to(torch.bfloat16)
    H = cfg.hidden_size
    out: dict = {"lens": list(lens)}

    def errs(got, k):
        return [
            rel(got[..., i * H : (i + 1) * H], ref[k][..., i * H : (i + 1) * H]) for i in range(len(layers))
        ]

    attach(model, None)
    out["hooks_bf16_single"] = errs(capture(model, ids, rows["single"].to(device), layers)[0], "single")
    fast_bf16 = {}
    for label, kw in (
        ("fast_eager_bf16", {"fast": True, "compile": False}),
        ("issue14_bf16", {"fast": False}),
    ):
        prepare_hybrid(model, **kw)
        for k, d in rows.items():
            got = capture(model, ids, d, layers)[0]
            out[f"{label}_{k}"] = errs(got, k)
            if label == "fast_eager_bf16":
                fast_bf16[k] = got
    if with_fp8:
        out.update(hybrid_fp8.fp8_columns(model, ids, rows, layers, errs, fast_bf16, device))
    return out


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="tiny random hybrid model on the CPU (smoke run)")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--budget-s", type=float, default=480.0, help="skip steps that would end past this")
    ap.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated subset of {','.join(STEPS)}")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/bench_hybrid"))
    ap.add_argument(
        "--conv",
        choices=("auto", "torch"),
        default="auto",
        help="the fast path's conv: auto = doc_conv's Triton kernel on CUDA where it checks; torch = shifted taps",
    )
    ap.add_argument(
        "--no-fp8-accuracy",
        dest="fp8_accuracy",
        action="store_false",
        help="accuracy_fp32 without FP8 columns",
    )
    a = ap.parse_args()
    a.step_set = set(a.steps.split(","))
    if a.step_set - set(STEPS):
        ap.error(f"unknown steps {sorted(a.step_set - set(STEPS))}")
    return a


class Run:
    """One bench run: the model and its inputs, the results so far (``res``, written out as each step ends)
    and the time budget. The steps are its methods, called in STEPS order by ``main``."""

    def __init__(self, a: argparse.Namespace, t_start: float):
        self.a, self.t_start, self.steps = a, t_start, a.step_set
        self.device = device = "cuda" if torch.cuda.is_available() and not a.tiny else "cpu"
        if a.tiny:
            a.iters, a.warmup = 1, 1
            rows, T, lo, hi, self.layers = 2, 96, 8, 40, [0, 3, 5, 7]
        else:
            rows, T, lo, hi, self.layers = 6, 8192, 1024, 8192, LAYERS
        self.N = N = rows * T
        import transformers

        self.res: dict = {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "device": device,
            "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
            "tokens_per_call": N,
            "capture_layers": self.layers,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "steps": {},
        }
        try:
            import fla

            self.res["fla"] = getattr(fla, "__version__", "?")
        except ImportError:
            self.res["fla"] = None
        self.res["matmul_tflops"] = measure_matmul_tflops() if device == "cuda" else None
        print(f"bf16 8192^3 matmul: {self.res['matmul_tflops']} TFLOP/s", flush=True)
        t0 = time.perf_counter()
        self.model, self.cfg = build(a.tiny, device)
        self.res["build_s"] = time.perf_counter() - t0
        print(
            f"built {self.cfg.num_hidden_layers} layers on {device} in {self.res['build_s']:.1f} s",
            flush=True,
        )
        g = torch.Generator().manual_seed(0)
        self.ids_single = torch.randint(0, self.cfg.vocab_size - 1, (rows, T), generator=g).to(device)
        self.doc_single = torch.zeros(rows, T, dtype=torch.long)
        self.ids_packed = torch.randint(0, self.cfg.vocab_size - 1, (1, N), generator=g).to(device)
        self.doc_packed = packed_docs(1, N, 1, lo, hi)
        self.lens = torch.unique_consecutive(self.doc_packed[0], return_counts=True)[1].tolist()
        self.res["packed_doc_lengths"] = self.lens
        self.outs: dict[str, torch.Tensor] = {}
        self.fast = None  # the fast path's capture, prepared once by the first direct step

    def save(self) -> None:
        with open(os.path.join(self.a.out, "bench_hybrid.json"), "w") as f:
            json.dump(self.res, f, indent=1)

    def left(self) -> float:
        return self.a.budget_s - (time.perf_counter() - self.t_start)

    def ended(self, name: str, entry: dict) -> None:
        now = time.perf_counter() - self.t_start
        entry["ended_at_s"] = now  # seconds since the bench started (each step's cost, for the next budget)
        self.res["steps"][name] = entry
        print(name, json.dumps(entry), flush=True)
        self.save()

    def skipped(self, name: str) -> None:
        self.res["steps"][name] = {"skipped": f"{self.left():.0f} s left"}

    def direct(self, name: str, ids, doc, need_final: bool, min_left: float) -> None:
        if name not in self.steps:
            return
        if self.left() < min_left:
            self.skipped(name)
            return
        model, cfg, layers, entry = self.model, self.cfg, self.layers, {}
        try:
            if self.fast is None:
                self.fast = prepare_hybrid(model, fast=True, compile=self.device == "cuda", conv=self.a.conv)
            attach(model, self.fast)
            entry["mode"] = self.fast.record()

            def fn(ids=ids, doc=doc):  # doc ids on the host: no device sync
                return capture(model, ids, doc, layers, need_final_hidden=need_final)

            entry.update(timed(fn, self.a.iters, self.a.warmup))
            n_layers = cfg.num_hidden_layers if need_final else max(layers) + 1
            flops = flops_per_call(cfg, n_layers, ids.numel(), causal_pairs(doc))
            entry.update(
                tok_s=ids.numel() / entry["s_per_iter"],
                layers_run=n_layers,
                flops_per_call=flops,
                **rates(flops, entry["s_per_iter"], self.res["matmul_tflops"]),
            )
            self.peak_memory(entry)
            if not need_final:
                self.outs[name] = fn()[0]
        except Exception as e:  # noqa: BLE001 - report and go on
            entry["error"] = f"{type(e).__name__}: {str(e)[:400]}"
            traceback.print_exc()
        self.ended(name, entry)

    def peak_memory(self, entry: dict) -> None:
        if self.device == "cuda":
            entry["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
            torch.cuda.reset_peak_memory_stats()

    def hooks_single(self) -> None:
        """The hook path (transformers' own forward) on the one-document rows: time, and the reference."""
        name = "hooks_single"
        if name not in self.steps:
            return
        if self.left() <= 60:
            self.skipped(name)
            return
        model, layers, N, entry = self.model, self.layers, self.N, {}
        try:
            attach(model, None)

            def hook_fn():
                return capture(model, self.ids_single, self.doc_single.to(self.device), layers)[0]

            entry.update(timed(hook_fn, max(1, self.a.iters - 1), 1))
            flops = flops_per_call(self.cfg, max(layers) + 1, N, causal_pairs(self.doc_single))
            entry.update(
                tok_s=N / entry["s_per_iter"], **rates(flops, entry["s_per_iter"], self.res["matmul_tflops"])
            )
            ref = hook_fn()
            if "direct_single" in self.outs:
                H = self.cfg.hidden_size
                got = self.outs["direct_single"]
                entry["direct_rel_err"] = rel(got, ref)
                entry["direct_rel_err_by_layer"] = [
                    rel(got[..., k * H : (k + 1) * H], ref[..., k * H : (k + 1) * H])
                    for k in range(len(layers))
                ]
            del ref
            self.peak_memory(entry)
        except Exception as e:  # noqa: BLE001
            entry["error"] = f"{type(e).__name__}: {str(e)[:400]}"
            traceback.print_exc()
        self.ended(name, entry)

    def packed_vs_alone(self) -> None:
        """Each document of the packed row through the hook path alone (exact per document)."""
        name = "packed_vs_alone"
        if name not in self.steps:
            return
        if "direct_packed" not in self.outs or self.left() <= 45:
            self.skipped(name)
            return
        entry = {"docs": []}
        try:
            attach(self.model, None)
            got = self.outs["direct_packed"]
            vs_alone(
                entry,
                self.model,
                self.ids_packed,
                got,
                self.lens,
                self.layers,
                self.cfg.hidden_size,
                self.left,
                self.device,
            )
        except Exception as e:  # noqa: BLE001
            entry["error"] = f"{type(e).__name__}: {str(e)[:400]}"
            traceback.print_exc()
        self.ended(name, entry)

    def packed_vs_alone_direct(
        self, name: str = "packed_vs_alone_direct", compiled: str = "direct_packed"
    ) -> None:
        """Packed vs alone within the direct path (eager, the same kernels): isolates packing from implementation.
        ``compiled``: the step whose output the eager packed row is also compared with."""
        if name not in self.steps:
            return
        if self.left() <= 45:
            self.skipped(name)
            return
        model, entry = self.model, {"docs": []}
        try:
            attach(model, prepare_hybrid(model, fast=True, compile=False, conv=self.a.conv))
            got = capture(model, self.ids_packed, self.doc_packed, self.layers)[0]
            if compiled in self.outs:
                entry["compiled_vs_eager_packed"] = rel(self.outs[compiled], got)
            vs_alone(
                entry, model, self.ids_packed, got, self.lens, self.layers, self.cfg.hidden_size, self.left
            )
            del got
        except Exception as e:  # noqa: BLE001
            entry["error"] = f"{type(e).__name__}: {str(e)[:400]}"
            traceback.print_exc()
        self.ended(name, entry)

    def profile(self, name: str = "profile", of: str = "direct_packed") -> None:
        """torch.profiler over one call of the fast path as ``of`` ran it (table: OUT/profile_hybrid_{of}.txt)."""
        if name not in self.steps or self.fast is None or self.left() <= 40:
            return
        model = self.model
        attach(model, self.fast)
        try:
            self.res["steps"][name] = profile(
                lambda: capture(model, self.ids_packed, self.doc_packed, self.layers),
                1,
                os.path.join(self.a.out, f"profile_hybrid_{of}.txt"),
            )
        except Exception as e:  # noqa: BLE001
            self.res["steps"][name] = {"error": f"{type(e).__name__}: {str(e)[:400]}"}
            traceback.print_exc()
        self.save()

    def conv(self) -> None:
        """The per-document conv, reference vs Triton kernel, with its byte floor (``hybrid_conv``)."""
        if "conv" not in self.steps:
            return
        n_linear = sum(t == "linear_attention" for t in self.cfg.layer_types[: max(self.layers) + 1])
        try:
            entry = conv_step(self.cfg, self.doc_packed, self.device, n_linear)
        except Exception as e:  # noqa: BLE001
            entry = {"error": f"{type(e).__name__}: {str(e)[:400]}"}
            traceback.print_exc()
        self.ended("conv", entry)

    def fp8(self) -> None:
        """The model quantised to FP8 in place, then the FP8 steps of each scaling (module docstring)."""
        if not self.steps & set(FP8_STEPS):
            return
        # measured on one H200 at the 27B shape (2026-12-04): quantising both ways 0.8 s, block packed 21.5 s
        # first call + 3 x 3.0 s, row packed 13.5 s + 3 x 2.7 s: ~60 s for the two packed steps
        if self.left() < 70:
            for name in FP8_STEPS:
                if name in self.steps:
                    self.skipped(name)
            return
        self.outs.pop("direct_single", None)
        try:
            self.res["fp8_quantise"], variants = hybrid_fp8.quantise(self.model, self.device)
        except Exception as e:  # noqa: BLE001 - a GPU without block-scaled FP8: the reason, no FP8 steps
            self.res["fp8_quantise"] = {"error": f"{type(e).__name__}: {str(e)[:400]}"}
            traceback.print_exc()
            self.save()
            return
        print("fp8_quantise", json.dumps(self.res["fp8_quantise"]), flush=True)
        for tag, scales in FP8_TAGS.items():
            variants.use(scales)
            self.fp8_steps(tag)

    def fp8_steps(self, tag: str) -> None:
        """One scaling's steps: ``{tag}_packed``, its error against bf16, ``_packed_vs_alone``, ``_profile``."""
        if not self.steps & {f"{tag}_{s}" for s in ("packed", "packed_vs_alone", "profile")}:
            return
        if self.device == "cuda":
            torch._dynamo.reset()  # the other scaling's graphs go: this one's regions compile afresh
        self.fast = None  # this scaling's own regions, compiled by its first step
        self.direct(f"{tag}_packed", self.ids_packed, self.doc_packed, False, 0 if tag == "fp8" else 30)
        self.fp8_vs_bf16(tag)
        self.packed_vs_alone_direct(f"{tag}_packed_vs_alone", f"{tag}_packed")
        self.profile(f"{tag}_profile", f"{tag}_packed")
        self.outs.pop(f"{tag}_packed", None)

    def fp8_vs_bf16(self, tag: str = "fp8") -> None:
        """``{tag}_packed``'s error per captured layer against direct_packed's bf16 output (the same inputs)."""
        step = f"{tag}_packed"
        e = self.res["steps"].get(step)
        if e is None or step not in self.outs or "direct_packed" not in self.outs:
            return
        got, want = self.outs[step], self.outs["direct_packed"]
        e["vs_bf16_by_layer"] = hybrid_fp8.by_layer(got, want, len(self.layers))
        e["vs_bf16"] = rel(got, want)
        self.res[f"{tag}_vs_bf16"] = hybrid_fp8.versus(self.res, fp8_step=step)
        self.save()

    def accuracy(self) -> None:
        """Frees the bench model first (the fp32 accuracy model is built next)."""
        self.outs.clear()
        self.model = None  # free the 27B model before the fp32 accuracy model (the steps above are done)
        if self.device == "cuda":
            torch.cuda.empty_cache()
        if "accuracy_fp32" in self.steps and self.left() > 40:
            try:
                self.res["steps"]["accuracy_fp32"] = accuracy_fp32(
                    self.a.tiny, self.device, self.a.fp8_accuracy
                )
            except Exception as e:  # noqa: BLE001
                self.res["steps"]["accuracy_fp32"] = {"error": f"{type(e).__name__}: {str(e)[:400]}"}
                traceback.print_exc()
            print("accuracy_fp32", json.dumps(self.res["steps"]["accuracy_fp32"]), flush=True)
        self.save()


def main() -> None:
    a = parse_args()
    t_start = time.perf_counter()
    os.makedirs(a.out, exist_ok=True)
    raise_compile_limits()
    run = Run(a, t_start)
    run.conv()
    run.direct("direct_packed", run.ids_packed, run.doc_packed, False, 0)
    run.direct("direct_single", run.ids_single, run.doc_single, False, 60)
    run.hooks_single()
    run.packed_vs_alone()
    run.packed_vs_alone_direct()
    run.direct("direct_packed_soft", run.ids_packed, run.doc_packed, True, 90)
    run.profile()
    run.fp8()
    run.accuracy()
    run.res["total_s"] = time.perf_counter() - t_start
    run.save()
    print_summary(run.res)


if __name__ == "__main__":
    main()
