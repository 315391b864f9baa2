"""Launch to first step, cold and warm (issue 22): the same run launched twice, the second with ``--resume auto``.

    PYTHONPATH=. python bench/bench_restart.py --out $OUT --parts one,two     # one H200 (both roles), two H200s
    PYTHONPATH=. python bench/bench_restart.py --tiny --out /tmp/br           # CPU: the tiny shape, one process
    PYTHONPATH=. python bench/bench_restart.py --target qwen3.6-27b --parts one --out $OUT   # the 27B shape

For each part: a fresh run directory; launch ``python -m trainer.pipeline`` (bench/bench_pipeline.py's
reference shape: random-weight Qwen3-8B-shaped target in ``--work``, 5-layer drafter, 8192-token sequences),
wait for its ``first_step`` start-up record, let it train ``--steps`` more steps, SIGINT (it saves a
checkpoint), wait for its exit; then launch the same run again with ``--resume auto`` (the warm restart:
the run's compile cache, startup.json) and do the same. Reported per launch, from the run's own start-up
records (docs/run-directory.md): ``first_step`` seconds (launch to the first optimizer step, counted from
the launcher's process start), when the target was loaded, when the drafters waited for the queue, the
compile cache's state; and the bench's own wall time from ``Popen`` to seeing the first step. Results:
``results.json`` and a Markdown table in ``--out``. Goal (issue 22): warm <= 15 s at the 8B shape.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_pipeline import REF, TINY, flags, log, make_data, make_target  # noqa: E402

# the 27B target: built by bench_seeds' builder (random weights at the exact Qwen3.6-27B text shape, saved as
# safetensors shards by parallel threads) in a process of its own, so that none of its memory stays in this one
BUILD_27B = (
    "import sys; sys.path[:0] = [sys.argv[1], sys.argv[1] + '/bench']; from bench_seeds import build_target; "
    "print(build_target(sys.argv[2], sys.argv[3] == 'tiny', sys.argv[4]))"
)


def records(path: str) -> list[dict]:
    out = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
    except OSError:
        pass
    return out


def launch_once(
    argv: list[str], run: str, since: int, steps: int, timeout: float, env: dict, profile: str | None = None
) -> dict:
    """One launch: wait for its first step (and ``steps`` more), SIGINT, wait; its start-up figures.
    ``profile``: run it under cProfile (bench/profiled_launch.py), stats to that path."""
    metrics = os.path.join(run, "metrics.jsonl")
    t0 = time.time()
    prog = (
        ["-m", "trainer.pipeline"]
        if profile is None
        else [os.path.join(ROOT, "bench", "profiled_launch.py"), profile]
    )
    p = subprocess.Popen(
        [sys.executable, *prog, *argv],
        cwd=ROOT,
        env=env,
        stdout=open(os.path.join(run + ".log"), "a"),  # noqa: SIM115 - the child's
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    seen_first, wall = None, None
    try:
        while time.time() - t0 < timeout and p.poll() is None:
            recs = records(metrics)[since:]
            first = [r for r in recs if r.get("kind") == "startup" and r.get("phase") == "first_step"]
            if first and seen_first is None:
                seen_first, wall = first[0], time.time() - t0
            done = [r for r in recs if r.get("kind") == "step"]
            if seen_first is not None and len(done) >= steps:
                break
            time.sleep(0.2)
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
        rc = p.wait(timeout=300)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    recs = records(metrics)[since:]
    su = [r for r in recs if r.get("kind") == "startup"]

    def at(phase: str) -> float | None:
        got = [r["elapsed_s"] for r in su if r.get("phase") == phase]
        return max(got) if got else None

    cache = next((r for r in su if r.get("phase") == "compile_cache"), {})
    return {
        "first_step_s": (seen_first or {}).get("seconds"),
        "wall_to_first_step_s": wall,
        "target_loaded_s": at("target_loaded"),
        "queue_filling_s": at("queue_filling"),
        "cache": cache.get("state"),
        "cache_reason": cache.get("reason"),
        "exit": rc,
        "records": len(recs),
        # every start-up record's phase at its first elapsed_s (where the seconds went)
        "phases": [
            [r.get("phase"), r.get("part") or r.get("role"), r.get("elapsed_s")]
            for r in su
            if r.get("phase") != "loading_target" or not r.get("bytes")
        ],
    }


def drop_page_cache() -> float:
    """``sync``, then drop the page cache (needs root); the seconds it took."""
    t0 = time.time()
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")
    return time.time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/bench_restart"))
    ap.add_argument("--work", default="/dev/shm/dflash_bench")
    ap.add_argument("--parts", default="one,two", help="one: both roles on GPU 0; two: target 0, drafter 1")
    ap.add_argument("--tiny", action="store_true", help="the tiny shape on CPU (part: cpu)")
    ap.add_argument("--steps", type=int, default=3, help="steps after the first before the SIGINT")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=5)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--anchors", type=int, default=512)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--sequences", type=int, default=200)
    ap.add_argument(
        "--profile",
        action="store_true",
        help="a third launch (warm) under cProfile: OUT/PART_warm.prof(.txt)",
    )
    ap.add_argument("--warm", type=int, default=1, help="warm launches after the cold one (each resumes)")
    ap.add_argument(
        "--runs",
        default=None,
        help="folder of the run directories (default: --work); at the 27B shape each checkpoint is ~26 GB "
        "and one is kept (--keep-checkpoints 1), so put them on a disk when the target fills /dev/shm",
    )
    ap.add_argument(
        "--drop-caches",
        action="store_true",
        help="before each launch: sync, and drop the kernel's page cache (root), so that the target's weights "
        "are read from the disk, not from memory (a --work on a disk; tmpfs is not dropped)",
    )
    ap.add_argument(
        "--target",
        choices=("qwen3-8b", "qwen3.6-27b"),
        default="qwen3-8b",
        help="qwen3-8b: bench_pipeline's dense reference shape; qwen3.6-27b: the hybrid seeds' target "
        "(bench_seeds' builder; needs flash-linear-attention on a GPU); --tiny: each one's tiny shape",
    )
    a = ap.parse_args()
    if a.tiny:
        a.seq, a.layers, a.block, a.anchors, a.sequences, a.parts = 256, 1, 8, 32, 200, "cpu"
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(a.work, exist_ok=True)
    os.makedirs(a.runs or a.work, exist_ok=True)
    target, data = os.path.join(a.work, "target"), os.path.join(a.work, "data")
    build = {}
    if a.target == "qwen3-8b":
        make_target(target, a.tiny)
        vocab = (TINY if a.tiny else REF)["vocab_size"]
    else:
        if not os.path.exists(os.path.join(target, ".complete")):
            t0 = time.time()
            dev = ["tiny", "cpu"] if a.tiny else ["full", "cuda:0"]
            subprocess.run([sys.executable, "-c", BUILD_27B, ROOT, target, *dev], check=True)
            build = {"seconds": time.time() - t0}
            log(f"27B-shaped target built and saved in {build['seconds']:.1f}s: {target}")
        with open(os.path.join(target, "config.json")) as f:
            cfg = json.load(f)
        vocab = cfg.get("text_config", cfg)["vocab_size"]
        build["bytes"] = sum(
            os.path.getsize(os.path.join(target, f)) for f in os.listdir(target) if f.endswith(".safetensors")
        )
    make_data(data, a.sequences, a.seq, vocab)
    # the code under test first; what the caller's PYTHONPATH holds (e.g. flash-linear-attention) after it
    path = os.pathsep.join(x for x in (ROOT, os.environ.get("PYTHONPATH", "")) if x)
    env = dict(os.environ, PYTHONPATH=path, PYTHONUNBUFFERED="1")
    if a.tiny:
        env.setdefault("OMP_NUM_THREADS", "1")
    layouts = {"cpu": ("cpu", "cpu"), "one": ("0", "0"), "two": ("0", "1")}
    parts = {}
    for part in a.parts.split(","):
        tg, dg = layouts[part]
        run = os.path.join(a.runs or a.work, f"restart_{part}")
        shutil.rmtree(run, ignore_errors=True)
        argv = flags(a, target, data, run, tg, dg, 100000)
        if a.target == "qwen3.6-27b":
            argv += ["--keep-checkpoints", "1"]
        out = []
        launches = ["none"] + ["auto"] * a.warm + (["auto"] if a.profile else [])
        for i, resume in enumerate(launches):
            argv = [*argv[: argv.index("--resume") + 1], resume, *argv[argv.index("--resume") + 2 :]]
            since = len(records(os.path.join(run, "metrics.jsonl")))
            profiled = a.profile and i == len(launches) - 1
            prof = os.path.join(a.out, f"{part}_warm.prof") if profiled else None
            dropped = drop_page_cache() if a.drop_caches else None
            r = launch_once(argv, run, since, a.steps, a.timeout, env, prof)
            if dropped is not None:
                r["page_cache_dropped_s"] = dropped
            r["launch"] = "cold" if i == 0 else "warm, profiled" if profiled else "warm"
            log(f"{part} {r['launch']}: {json.dumps(r)}")
            out.append(r)
        parts[part] = out
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump({**parts, "target": {"shape": a.target, "path": target, **build}}, f, indent=1)
    rows = [
        "| part | launch | launch to first step (s) | bench wall (s) | target loaded at (s) | queue waited from (s) | compile cache |",
        "|---|---|---|---|---|---|---|",
    ]
    for part, rs in parts.items():
        for r in rs:
            rows.append(
                f"| {part} | {r['launch']} | {r['first_step_s']} | {r['wall_to_first_step_s'] and round(r['wall_to_first_step_s'], 2)} "
                f"| {r['target_loaded_s']} | {r['queue_filling_s']} | {r['cache']} |"
            )
    table = "\n".join(rows)
    with open(os.path.join(a.out, "table.md"), "w") as f:
        f.write(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
