"""Drafter training step alone: context tok/s, TFLOP/s and MFU on the reference shape (Qwen3-8B width).

    PYTHONPATH=. python bench/bench_drafter.py --out $OUT             # on the H200
    PYTHONPATH=. python bench/bench_drafter.py --target qwen3.6-27b --configs seed --out $OUT  # the seeds' target
    PYTHONPATH=. python bench/bench_drafter.py --tiny --out /tmp/bd   # CPU smoke run (SDPA path)
    PYTHONPATH=. python bench/bench_drafter.py --arch dflash,dflash2 --configs main,seed --out $OUT  # DFlash 2's cost

One step = sample_anchors, drafter forward (FlexAttention, compiled layers), chunked DFlash loss, backward,
grad-norm clip and AdamW: what ``trainer.runtime.roles.DrafterRole`` does per micro-batch plus the optimizer step,
in the pipeline's precision (fp32 weights, bf16 autocast; bf16 frozen embedding / lm_head; random
bf16 target hidden states). Configurations (``--configs``):
- ``main``: one row of 8192 tokens (one document), 5 layers, block 16, 512 anchors;
- ``main_eager``: the same without compiled layers and loss (what compiling buys);
- ``main_sync``: the same with anchors sized per batch (``pad_to_max=False``: one host sync per step);
- ``packed``: one row of 49152 tokens packed with documents of 1024..8192 tokens, 3072 anchors (512 per 8192);
- ``seed``: the seed's settings: a 49152-token row, max 1024 anchors, block 32, soft labels (peak memory).
FLOPs per bench/flops.py (attention under the actual mask, from the sampled anchors).

``--arch dflash,dflash2`` runs every configuration for each architecture (DFlash 2 with the published module
sizes: conv kernel 2, groups of 16, selector rank 256, top 16; the same block size as DFlash 1, so the two differ
only by the modules) and prints DFlash 2's step time and peak memory against DFlash 1's. A DFlash 2 step adds
the convolutions in every layer and the selector's loss (its top-k ``lm_head`` pass, bilinear scores and
backward), as ``DrafterRole`` does; its entries are named ``<config>:dflash2``.
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

from bench.bench_target import packed_docs, raise_compile_limits  # noqa: E402
from bench.flops import (  # noqa: E402
    QWEN3_8B,
    Shape,
    dflash2_extra_flops,
    drafter_pairs,
    drafter_step_flops,
    measure_matmul_tflops,
    rates,
)
from bench.prof import profile, timed  # noqa: E402
from trainer.drafting import loss as loss_mod  # noqa: E402
from trainer.drafting.config import DFLASH2_DEFAULTS, DraftConfig  # noqa: E402
from trainer.drafting.head import FrozenHead, _frozen_norm  # noqa: E402
from trainer.drafting.loss import dflash_loss  # noqa: E402
from trainer.drafting.masks import sample_anchors  # noqa: E402
from trainer.drafting.selector import selector_loss  # noqa: E402
from trainer.model import DFlashDrafter  # noqa: E402

CONFIGS = {
    "main": dict(T=8192, docs=None, block=16, anchors=512, soft=False),
    "main_eager": dict(T=8192, docs=None, block=16, anchors=512, soft=False, eager=True),
    "main_sync": dict(T=8192, docs=None, block=16, anchors=512, soft=False, sync=True),
    "packed": dict(T=49152, docs=(1024, 8192), block=16, anchors=3072, soft=False),
    "seed": dict(T=49152, docs=(1024, 8192), block=32, anchors=1024, soft=True),
}


TARGETS = ("qwen3-8b", "qwen3.6-27b")
ARCHS = ("dflash", "dflash2")


def entry_name(config: str, arch: str) -> str:
    return config if arch == "dflash" else f"{config}:{arch}"


def target_config(tiny: bool, target: str = "qwen3-8b"):
    from transformers import Qwen3Config

    if target == "qwen3.6-27b":  # the seeds' target: its text shape (bench_hybrid.text_config)
        from bench.bench_hybrid import text_config

        return text_config(tiny)

    if tiny:
        return Qwen3Config(
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=8,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            vocab_size=1024,
        )
    s = QWEN3_8B
    return Qwen3Config(
        hidden_size=s.hidden,
        intermediate_size=s.intermediate,
        num_hidden_layers=36,
        num_attention_heads=s.heads,
        num_key_value_heads=s.kv_heads,
        head_dim=s.head_dim,
        vocab_size=s.vocab,
        rope_theta=1_000_000.0,
        max_position_embeddings=40960,
    )


def run_config(name: str, c: dict, tcfg, device: str, a, matmul_tflops, arch: str = "dflash") -> dict:
    tiny = device == "cpu"
    T = c["T"] if not tiny else max(64, c["T"] // 128)
    A = c["anchors"] if not tiny else max(4, c["anchors"] // 128)
    bs = c["block"]
    n_target = int(getattr(tcfg, "num_hidden_layers", 36))
    if tiny:
        layer_ids = [1, 3, 5, 6, 7]
    elif n_target == 64:  # the seeds' capture layers for Qwen3.6-27B
        layer_ids = [1, 16, 31, 46, 61]
    else:
        layer_ids = [1, 9, 17, 25, 33]
    dflash2 = arch == "dflash2"
    cfg = DraftConfig.from_target_config(
        tcfg,
        num_draft_layers=5,
        block_size=bs,
        target_layer_ids=layer_ids,
        arch=arch,
        dflash2={} if dflash2 else None,
    )
    shape = Shape(
        hidden=cfg.hidden_size,
        intermediate=cfg.intermediate_size,
        heads=cfg.num_attention_heads,
        kv_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        vocab=cfg.vocab_size,
    )
    torch.manual_seed(0)
    with torch.device(device):  # built on the device
        drafter = DFlashDrafter(cfg).train()
        hdt = torch.bfloat16 if device == "cuda" else torch.float32
        embed = torch.nn.Embedding(cfg.vocab_size, cfg.hidden_size, dtype=hdt)
        lm_head = torch.nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, dtype=hdt)
        torch.nn.init.normal_(embed.weight, std=0.02)
        torch.nn.init.normal_(lm_head.weight, std=0.02)
        head = FrozenHead(embed, _frozen_norm(torch.ones(cfg.hidden_size, dtype=hdt), 1e-6), lm_head)
    eager = c.get("eager", False) or tiny
    drafter.compile_layers = not eager
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01, fused=device == "cuda")
    g = torch.Generator(device=device).manual_seed(0)
    gc = torch.Generator().manual_seed(1)
    ids = torch.randint(0, cfg.vocab_size - 1, (1, T), generator=gc).to(device)
    doc = (
        torch.zeros(1, T, dtype=torch.long)
        if c["docs"] is None
        else packed_docs(1, T, 3, *(max(8, x // (128 if tiny else 1)) for x in c["docs"]))
    ).to(device)
    lm = torch.ones(1, T, dtype=torch.bool, device=device)
    hidden = (torch.randn(1, T, cfg.num_captured * cfg.hidden_size, generator=g, device=device) * 0.5).to(hdt)
    final = (torch.randn(1, T, cfg.hidden_size, generator=g, device=device)).to(hdt) if c["soft"] else None
    attn_impl = "flex" if device == "cuda" else "sdpa"
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16)
        if device == "cuda"
        else torch.autocast("cpu", enabled=False)
    )
    last = {}
    orig_ce = loss_mod._ce_chunk_fn
    if eager:
        loss_mod._ce_chunk_fn = lambda _dev: loss_mod._ce_chunk

    phases: list = []

    def mark(what: str) -> None:  # first step only: where the time goes (compiles included)
        if not last:
            torch.cuda.synchronize() if device == "cuda" else None
            phases.append((what, time.perf_counter()))
            print(f"  [{name}] {what} {phases[-1][1] - phases[0][1]:.1f}s", flush=True)

    def step():
        mark("start")
        anchors = sample_anchors(doc, lm, bs, A, g, pad_to_max=not c.get("sync", False))
        with autocast:
            out = drafter(hidden, ids, doc, anchors, head.embed_tokens, attn_impl=attn_impl)
            mark("forward")
            topk = cfg.selector_top_k if dflash2 else 0
            loss, m = dflash_loss(out, head, ids, anchors, gamma=7.0, target_final_hidden=final, topk=topk)
            if dflash2:  # as DrafterRole: the candidates from the loss's logits, the selector's loss added
                cands = (m.pop("topk_ids"), m.pop("topk_values"))
                sel, _s = selector_loss(
                    out,
                    drafter.candidate_selector,
                    head.lm_head.weight,
                    ids,
                    anchors,
                    7.0,
                    candidates=cands,
                    labels=m.pop("label_ids"),
                )
                loss = loss + sel
            mark("loss")
        loss.backward()
        mark("backward")
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        mark("optimizer")
        last["anchors"], last["loss"] = anchors, loss

    entry: dict = {
        "arch": arch,
        **({f: getattr(cfg, f) for f in DFLASH2_DEFAULTS} if dflash2 else {}),
        "T": T,
        "max_anchors": A,
        "block_size": bs,
        "soft_labels": c["soft"],
        "compiled": not eager,
    }
    try:
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        entry.update(timed(step, a.iters if not tiny else 1, a.warmup if not tiny else 1))
        anchors = last["anchors"]
        n_real = int((anchors >= 0).sum())
        pairs = drafter_pairs(anchors, doc, bs)
        parts = drafter_step_flops(
            shape,
            cfg.num_draft_layers,
            cfg.num_captured,
            T,
            anchors.numel() * bs,
            anchors.numel() * (bs - 1),
            pairs,
            soft_labels=c["soft"],
        )
        if dflash2:
            parts.update(
                dflash2_extra_flops(
                    shape,
                    cfg.num_draft_layers,
                    anchors.numel() * bs,
                    anchors.numel() * (bs - 1),
                    cfg.conv_kernel_size,
                    cfg.conv_group_size,
                    cfg.selector_rank,
                    cfg.selector_top_k,
                )
            )
            parts["total"] = sum(v for k, v in parts.items() if k != "total")
        entry.update(
            {
                "anchors_real": n_real,
                "anchors_shape": list(anchors.shape),
                "ctx_tok_s": T / entry["s_per_iter"],
                "flops": parts,
                "loss": float(last["loss"]),
                **rates(parts["total"], entry["s_per_iter"], matmul_tflops),
            }
        )
        if device == "cuda":
            entry["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
        if name in a.profile.split(","):
            fn = f"profile_drafter_{entry_name(name, arch).replace(':', '_')}.txt"
            entry["profile"] = profile(step, 2, os.path.join(a.out, fn))
    except Exception as e:  # noqa: BLE001 - report and go on
        entry["error"] = f"{type(e).__name__}: {str(e)[:400]}"
        traceback.print_exc()
    finally:
        loss_mod._ce_chunk_fn = orig_ce
    return entry


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="small shapes on the CPU (smoke run)")
    ap.add_argument("--configs", default="main_eager,main,main_sync,packed,seed")
    ap.add_argument(
        "--target", choices=TARGETS, default="qwen3-8b", help="the target whose shape the drafter takes"
    )
    ap.add_argument(
        "--arch",
        default="dflash",
        help="drafter architecture(s), comma-separated: dflash, dflash2 (dflash,dflash2 compares them)",
    )
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--profile", default="main")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/bench_drafter"))
    ap.add_argument("--dump-after", type=int, default=0, help="dump all threads' stacks after N s (hangs)")
    a = ap.parse_args()
    archs = a.arch.split(",")
    if not archs or any(x not in ARCHS for x in archs):
        ap.error(f"--arch takes {' or '.join(ARCHS)} (comma-separated), got {a.arch!r}")
    names = a.configs.split(",")
    if any(n not in CONFIGS for n in names):
        ap.error(f"--configs takes {', '.join(CONFIGS)} (comma-separated), got {a.configs!r}")
    os.makedirs(a.out, exist_ok=True)
    raise_compile_limits()
    if a.dump_after:
        import faulthandler

        faulthandler.dump_traceback_later(a.dump_after, repeat=True)
    device = "cpu" if a.tiny or not torch.cuda.is_available() else "cuda"
    import transformers

    res = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": device,
        "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "configs": {},
    }
    res["matmul_tflops"] = measure_matmul_tflops() if device == "cuda" else None
    print(f"bf16 8192^3 matmul: {res['matmul_tflops']} TFLOP/s", flush=True)
    tcfg = target_config(a.tiny, a.target)
    res["target"] = a.target
    for name, arch in ((n, x) for n in names for x in archs):
        entry = run_config(name, CONFIGS[name], tcfg, device, a, res["matmul_tflops"], arch)
        try:
            from torch._dynamo.utils import counters

            entry["dynamo"] = {
                k: dict(v) for k, v in counters.items() if k in ("stats", "recompiles", "graph_break")
            }
        except Exception:  # noqa: BLE001
            pass
        res["configs"][entry_name(name, arch)] = entry
        if arch == "dflash2":
            res["dflash2_vs_dflash"] = dflash2_vs_dflash(res["configs"])
        print(
            entry_name(name, arch),
            json.dumps({k: v for k, v in entry.items() if k not in ("profile", "dynamo")}),
            flush=True,
        )
        with open(os.path.join(a.out, "bench_drafter.json"), "w") as f:
            json.dump(res, f, indent=1)
        if device == "cuda":
            torch.cuda.empty_cache()

    print(
        f"\n{'config':20s} {'ctx tok/s':>10s} {'TFLOP/s':>8s} {'%meas':>6s} {'%989':>6s} {'s/step':>7s} {'1st s':>6s} {'peak GiB':>8s}"
    )
    for name, e in res["configs"].items():
        if "error" in e:
            print(f"{name:20s} ERROR {e['error'][:100]}")
            continue
        print(
            f"{name:20s} {e['ctx_tok_s']:10.0f} {e['tflops']:8.1f} {100 * e.get('mfu_measured', 0):6.1f} "
            f"{100 * e['mfu_datasheet']:6.1f} {e['s_per_iter']:7.3f} {e['first_call_s']:6.1f} {e.get('peak_mem_gib', 0):8.1f}"
        )
    for name, d in res.get("dflash2_vs_dflash", {}).items():
        peak = f", peak memory {d['peak_mem_gib_extra']:+.2f} GiB" if "peak_mem_gib_extra" in d else ""
        print(
            f"DFlash 2 vs DFlash 1, {name}: step time x{d['step_time_ratio']:.3f} ({d['step_s_extra']:+.4f} s){peak}"
        )


def dflash2_vs_dflash(configs: dict) -> dict:
    """Per configuration run under both architectures: DFlash 2's step time and peak memory against DFlash 1's."""
    out = {}
    for name, e1 in configs.items():
        e2 = configs.get(entry_name(name, "dflash2"))
        if e1.get("arch") != "dflash" or not e2 or "error" in e1 or "error" in e2:
            continue
        d = {
            "step_time_ratio": e2["s_per_iter"] / e1["s_per_iter"],
            "step_s_extra": e2["s_per_iter"] - e1["s_per_iter"],
        }
        if "peak_mem_gib" in e1 and "peak_mem_gib" in e2:
            d["peak_mem_gib_extra"] = e2["peak_mem_gib"] - e1["peak_mem_gib"]
            d["peak_mem_ratio"] = e2["peak_mem_gib"] / e1["peak_mem_gib"]
        out[name] = d
    return out


if __name__ == "__main__":
    main()
