"""Timing and profiling helpers shared by the trainer benches (CUDA events; torch.profiler tables)."""

from __future__ import annotations

import re
import time

import torch

# kernel name -> class, first match wins
_CLASSES = [
    ("attention", re.compile(r"flash|fmha|attn|attention|flex|sdpa|varlen", re.I)),
    ("gated delta (fla)", re.compile(r"delta|wy_|kkt|solve_tril|l2norm|chunk_local_cumsum|chunk_fwd", re.I)),
    ("matmul", re.compile(r"gemm|cutlass|nvjet|sm90_xmma|cublas|wgmma|matmul|_mm_|addmm", re.I)),
    ("fused (triton)", re.compile(r"^triton_", re.I)),
    ("copy/cast", re.compile(r"copy|cast|memcpy|memset|fill", re.I)),
]


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, iters: int, warmup: int) -> dict:
    """Run ``fn`` warmup + iters times; seconds per iteration (CUDA-event timed when on CUDA)."""
    t0 = time.perf_counter()
    fn()
    sync()
    first = time.perf_counter() - t0
    for _ in range(max(0, warmup - 1)):
        fn()
    sync()
    if torch.cuda.is_available():
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(iters):
            fn()
        e1.record()
        e1.synchronize()
        per = e0.elapsed_time(e1) / 1e3 / iters
    else:
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        per = (time.perf_counter() - t0) / iters
    return {"s_per_iter": per, "first_call_s": first}


def graph_timed(fn, iters: int, warmup: int = 3) -> float | None:
    """Seconds per call of ``fn`` replayed from a CUDA graph: the GPU's time without the host's launch cost
    (which event timing of eager calls includes wherever the host is the slower side). None where ``fn``
    cannot be captured (or without CUDA)."""
    if not torch.cuda.is_available():
        return None
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up off the default stream, as graph capture wants
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fn()
    except Exception:  # noqa: BLE001 - not capturable: the caller times it eagerly
        return None
    graph.replay()
    sync()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(iters):
        graph.replay()
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1) / 1e3 / iters


def device_timed(fn, iters: int, eager: bool = False) -> float:
    """Seconds per call of ``fn``: from a CUDA graph's replay where it can be captured (``graph_timed``), else,
    or with ``eager``, the calls as issued (``timed``: the host's launches included)."""
    got = None if eager else graph_timed(fn, iters)
    return got if got is not None else timed(fn, iters, 3)["s_per_iter"]


def profile(fn, iters: int, path: str, row_limit: int = 40) -> dict:
    """torch.profiler over ``iters`` calls: writes the key_averages table to ``path``; returns GPU time
    by kernel class (seconds per iteration) and the share of wall time the GPU was busy."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    sync()
    t0 = time.perf_counter()
    with tprofile(activities=acts) as prof:
        for _ in range(iters):
            fn()
        sync()
    wall = time.perf_counter() - t0
    ka = prof.key_averages()
    sort = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    table = ka.table(sort_by=sort, row_limit=row_limit, max_name_column_width=90)
    by_class: dict[str, float] = {}
    gpu_total = 0.0
    for evt in prof.events():
        dev_t = getattr(evt, "device_time", None)
        if dev_t is None:
            dev_t = getattr(evt, "cuda_time", 0.0)
        if (
            getattr(evt, "device_type", None) is None
            or str(evt.device_type) != "DeviceType.CUDA"
            or not dev_t
        ):
            continue
        name = evt.name
        cls = next((c for c, rx in _CLASSES if rx.search(name)), "other")
        by_class[cls] = by_class.get(cls, 0.0) + dev_t / 1e6
        gpu_total += dev_t / 1e6
    with open(path, "w") as f:
        f.write(table)
        f.write("\n\nGPU kernel time by class (s per iteration):\n")
        for c, t in sorted(by_class.items(), key=lambda kv: -kv[1]):
            f.write(f"  {c:16s} {t / iters:.4f}  ({t / max(gpu_total, 1e-12):.1%})\n")
        f.write(f"  wall per iteration {wall / iters:.4f} s; GPU busy {gpu_total / max(wall, 1e-12):.1%}\n")
    return {
        "gpu_s_by_class": {c: t / iters for c, t in by_class.items()},
        "gpu_busy": gpu_total / max(wall, 1e-12),
        "wall_s_per_iter": wall / iters,
    }
