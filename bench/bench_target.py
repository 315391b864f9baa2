"""Target capture alone: tok/s and TFLOP/s on the reference shape (Qwen3-8B, random weights, built on the GPU).

    PYTHONPATH=. python bench/bench_target.py --out $OUT            # on the H200
    PYTHONPATH=. python bench/bench_target.py --tiny --out /tmp/bt  # CPU smoke run of the same script

Variants (each timed with CUDA events after warm-up; FLOPs per bench/flops.py under the actual mask):
- ``hf_full_hooks``: the baseline, a plain transformers forward of the whole base model (all layers) with
  5 forward hooks, no position_ids (one document per row; sdpa picks its causal kernel);
- ``hooks_*``: ``trainer.target.capture`` on the hook path (stops after the last captured layer), one doc
  per row (``single``) or packed documents (``packed``: transformers builds a dense block-causal mask);
- ``direct_<attn>_*``: ``capture`` after ``prepare_capture(model, attn)`` (own layer loop, compiled).
Each direct variant is checked against the hook path's output (relative error) on the same inputs.
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

from bench.flops import Shape, causal_pairs, measure_matmul_tflops, rates, target_capture_flops  # noqa: E402
from bench.prof import profile, timed  # noqa: E402
from trainer.target.base import attach  # noqa: E402
from trainer.target.capture import capture, prepare_capture  # noqa: E402

LAYERS = [1, 9, 17, 25, 33]


def build_target(tiny: bool, device: str):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    if tiny:
        kw = dict(
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=8,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            vocab_size=512,
        )
    else:
        kw = dict(
            hidden_size=4096,
            intermediate_size=12288,
            num_hidden_layers=36,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            vocab_size=151936,
        )
    cfg = Qwen3Config(**kw, max_position_embeddings=40960, rope_theta=1_000_000.0, tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):  # materialised and initialised on the device, never through a CPU copy
            model = Qwen3ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    model.eval().requires_grad_(False)
    shape = Shape(
        hidden=cfg.hidden_size,
        intermediate=cfg.intermediate_size,
        heads=cfg.num_attention_heads,
        kv_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        vocab=cfg.vocab_size,
    )
    return model, shape


def raise_compile_limits(n: int = 64) -> None:
    """Benches compile several shapes of one step: let dynamo keep them all."""
    import torch._dynamo

    for name in (
        "cache_size_limit",
        "recompile_limit",
        "accumulated_cache_size_limit",
        "accumulated_recompile_limit",
    ):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(n, getattr(torch._dynamo.config, name)))


def packed_docs(B: int, T: int, seed: int, lo: int, hi: int) -> torch.Tensor:
    """Doc ids for rows packed with documents of lengths uniform in [lo, hi] (last one cut to fit)."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(B):
        row, d = [], 0
        while len(row) < T:
            n = int(torch.randint(lo, hi + 1, (1,), generator=g))
            row += [d] * n
            d += 1
        rows.append(row[:T])
    return torch.tensor(rows)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="small random model on the CPU (smoke run)")
    ap.add_argument("--rows", type=int, default=2)
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument(
        "--variants",
        default="hf_full_hooks,direct_varlen_single,direct_varlen_packed,hooks_single,"
        "hooks_packed,direct_flex_packed,direct_sdpa_causal_single,direct_varlen_long",
    )
    ap.add_argument(
        "--profile",
        default="hf_full_hooks,direct_varlen_packed",
        help="variants to profile (torch.profiler table to OUT/profile_target_<variant>.txt)",
    )
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/bench_target"))
    return ap.parse_args()


class Run:
    """One bench run: the model, its inputs (``single``, ``packed`` and ``long`` rows), the hook path's
    reference outputs and the results so far (``res``, written out after each variant)."""

    def __init__(self, a: argparse.Namespace):
        self.a = a
        self.device = device = "cpu" if a.tiny or not torch.cuda.is_available() else "cuda"
        if a.tiny:
            a.seq, a.iters, a.warmup = 256, 1, 1
            self.layers = [1, 3, 5]
        else:
            self.layers = LAYERS
        import transformers

        self.res = res = {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "device": device,
            "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
            "rows": a.rows,
            "seq": a.seq,
            "capture_layers": self.layers,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "variants": {},
        }
        res["matmul_tflops"] = measure_matmul_tflops() if device == "cuda" else None
        if device == "cuda":
            from trainer.target.attention import VARLEN_PARAMS, varlen_works

            res["varlen_params"], res["varlen_works"] = (
                sorted(VARLEN_PARAMS),
                varlen_works(torch.device("cuda")),
            )
        print(f"bf16 8192^3 matmul: {res['matmul_tflops']} TFLOP/s", flush=True)
        t0 = time.perf_counter()
        self.model, self.shape = build_target(a.tiny, device)
        res["build_s"] = time.perf_counter() - t0
        B, T = a.rows, a.seq
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, self.shape.vocab - 1, (B, T), generator=g).to(device)
        self.single = torch.zeros(B, T, dtype=torch.long)
        self.packed = packed_docs(B, T, 1, max(16, T // 32), T // 2)
        long_T = 6 * T  # the pipeline's shape: one row of a 49152-token budget, documents up to 8192
        self.ids_long = torch.randint(0, self.shape.vocab - 1, (1, long_T), generator=g).to(device)
        self.packed_long = packed_docs(1, long_T, 2, max(16, T // 32), T)
        res["docs_per_row_packed"] = [len(set(r)) for r in self.packed.tolist()]
        res["docs_long"] = len(set(self.packed_long[0].tolist()))
        self.refs: dict[str, torch.Tensor] = {}

    def inputs(self, kind: str):
        if kind == "long":
            return self.ids_long, self.packed_long
        return self.ids, (self.single if kind == "single" else self.packed)

    def reference(self, kind: str) -> torch.Tensor:
        if kind not in self.refs:
            attach(self.model, None)
            i, d = self.inputs(kind)
            self.refs[kind] = capture(self.model, i, d.to(self.device), self.layers)[0]
        return self.refs[kind]

    def full_hooks(self, i):
        """A plain forward of the whole base model with forward hooks on the captured layers."""
        model, layers, got = self.model, self.layers, {}
        hooks = [
            model.model.layers[j].register_forward_hook(
                lambda _m, _a, out, j=j, got=got: got.__setitem__(
                    j, out[0] if isinstance(out, tuple) else out
                )
            )
            for j in layers
        ]

        def fn(i=i, got=got):
            with torch.no_grad():
                model.model(input_ids=i, use_cache=False)
            return torch.cat([got[j] for j in layers], -1)

        return fn, hooks

    def direct(self, name: str, i, docs, entry: dict):
        """``capture`` after ``prepare_capture(model, attn)`` (compiled first on CUDA, eager if that fails)."""
        model, layers, cuda = self.model, self.layers, self.device == "cuda"
        attn = name[len("direct_") :].rsplit("_", 1)[0]
        entry["attn"] = prepare_capture(model, attn=attn, compile=cuda)
        if cuda:  # compile first here, so that a compile failure falls back to eager
            try:
                capture(model, i, docs, layers)
            except Exception as e:  # noqa: BLE001
                entry["compile_error"] = f"{type(e).__name__}: {str(e)[:300]}"
                traceback.print_exc()
                prepare_capture(model, attn=attn, compile=False)
        # doc_ids on the host: the varlen path reads document boundaries there without a device sync
        host_docs = docs

        def fn(i=i, host_docs=host_docs):
            return capture(model, i, host_docs, layers)[0]

        return fn

    def against_reference(self, entry: dict, fn, ref) -> None:
        out = fn()
        entry["rel_err_vs_hooks"] = float((out.float() - ref.float()).norm() / ref.float().norm())
        H = self.shape.hidden  # per captured layer: bf16 rounding grows with depth
        entry["rel_err_by_layer"] = [
            float(
                (out[..., k * H : (k + 1) * H].float() - ref[..., k * H : (k + 1) * H].float()).norm()
                / ref[..., k * H : (k + 1) * H].float().norm()
            )
            for k in range(len(self.layers))
        ]
        attach(self.model, None)
        prepare_capture(
            self.model, attn=entry["attn"], compile=self.device == "cuda" and "compile_error" not in entry
        )

    def variant(self, name: str) -> dict:
        a, model, layers = self.a, self.model, self.layers
        kind = name.rsplit("_", 1)[1]
        i, docs = self.inputs(kind)
        docs_dev = docs.to(self.device)
        n_layers = max(layers) + 1
        entry: dict = {}
        try:
            attach(model, None)
            hooks, ref = [], None
            if name == "hf_full_hooks":
                fn, hooks = self.full_hooks(i)
                n_layers = model.config.num_hidden_layers
            elif name.startswith("hooks_"):

                def fn(i=i, docs_dev=docs_dev):
                    return capture(model, i, docs_dev, layers)[0]
            else:
                ref = self.reference(kind)  # the hook path's output, computed before switching the model over
                fn = self.direct(name, i, docs, entry)
            tok = i.numel()
            entry.update(timed(fn, a.iters, a.warmup))
            flops = target_capture_flops(self.shape, n_layers, tok, causal_pairs(docs))
            entry.update(
                {
                    "tokens_per_iter": tok,
                    "layers_run": n_layers,
                    "tok_s": tok / entry["s_per_iter"],
                    "flops_per_iter": flops,
                    **rates(flops, entry["s_per_iter"], self.res["matmul_tflops"]),
                }
            )
            if name.startswith("direct_"):
                self.against_reference(entry, fn, ref)
            if self.device == "cuda":
                entry["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
                torch.cuda.reset_peak_memory_stats()
            if name in a.profile.split(","):
                entry["profile"] = profile(fn, 2, os.path.join(a.out, f"profile_target_{name}.txt"))
            for h in hooks:
                h.remove()
        except Exception as e:  # noqa: BLE001 - report and go on with the next variant
            entry["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            traceback.print_exc()
        return entry


def print_summary(res: dict) -> None:
    print(
        f"\n{'variant':28s} {'tok/s':>9s} {'TFLOP/s':>8s} {'%meas':>6s} {'%989':>6s} {'1st s':>6s} {'relerr':>8s}"
    )
    for name, e in res["variants"].items():
        if "error" in e:
            print(f"{name:28s} ERROR {e['error'][:80]}")
            continue
        print(
            f"{name:28s} {e['tok_s']:9.0f} {e['tflops']:8.1f} {100 * e.get('mfu_measured', 0):6.1f} "
            f"{100 * e['mfu_datasheet']:6.1f} {e['first_call_s']:6.1f} {e.get('rel_err_vs_hooks', float('nan')):8.1e}"
        )


def main() -> None:
    a = parse_args()
    os.makedirs(a.out, exist_ok=True)
    raise_compile_limits()
    run = Run(a)
    for name in a.variants.split(","):
        entry = run.variant(name)
        run.res["variants"][name] = entry
        print(name, json.dumps({k: v for k, v in entry.items() if k != "profile"}), flush=True)
        with open(os.path.join(a.out, "bench_target.json"), "w") as f:
            json.dump(run.res, f, indent=1)
    attach(run.model, None)
    print_summary(run.res)


if __name__ == "__main__":
    main()
