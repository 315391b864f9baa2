"""The whole pipeline against its stages alone, on the reference shape (issue 9).

    PYTHONPATH=. python bench/bench_pipeline.py --out $OUT --parts alone,two      # two H200s
    PYTHONPATH=. python bench/bench_pipeline.py --out $OUT --parts alone1,one     # both roles on GPU 0
    PYTHONPATH=. python bench/bench_pipeline.py --tiny --out /tmp/bp               # CPU smoke run

What it does (everything under ``--work``, default /dev/shm/dflash_bench; results in ``--out``):
- ``target/``: a random-weight Qwen3-8B-shaped target (hidden 4096, 36 layers, 32/8 heads, intermediate
  12288, vocab 151936; bf16, built on the GPU, saved as safetensors), unless it exists;
- ``data/``: synthetic token data: sequences of ``--seq`` tokens, each an arithmetic progression over 4096
  token ids (predictable: the drafter's loss falls), one sequence per micro-batch (token budget = seq);
- ``alone``: the target stage alone on GPU 0 (``TargetRole.run`` over the same micro-batches, as the
  pipeline's target worker calls it) and the drafter stage alone on GPU 1 (``DrafterRole`` on random
  hidden states of the right shape: micro-step, clip, AdamW, the per-step metrics sync), in two processes
  at once; tok/s over the timed steps after warm-up; ``alone1``: the same two on GPU 0, one after the other
  (what the 1-GPU run is compared with);
- ``two``: ``python -m trainer.pipeline --target-gpus 0 --drafter-gpus 1`` (launcher + 2 workers);
- ``one``: ``--target-gpus 0 --drafter-gpus 0`` (one process, both roles on one GPU);
for each pipeline run: the steady-state tok/s from its step records (the bench's own count: context tokens
of the steps in the window / the window's length, the window = the steps after the first ``--skip`` of
them), the metrics.jsonl throughput records' drafter tok/s over the same window, the queue depth over it,
and ``pipeline_<part>.png`` by ``bench/plot_run.py``. Settings: drafter 5 layers, block 16, 512 anchors,
capture [1, 9, 17, 25, 33], 8192-token sequences, bf16.
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
sys.path.insert(0, ROOT)
from plot_run import load  # noqa: E402  (bench/ is this script's own folder: metrics.jsonl reader)

REF = dict(
    hidden_size=4096,
    intermediate_size=12288,
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    vocab_size=151936,
)
TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=512,
)


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def make_target(path: str, tiny: bool) -> None:
    if os.path.isfile(os.path.join(path, "config.json")):
        return
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    device = "cpu" if tiny else "cuda:0"
    cfg = Qwen3Config(
        **(TINY if tiny else REF),
        max_position_embeddings=40960,
        rope_theta=1_000_000.0,
        tie_word_embeddings=False,
    )
    t0 = time.time()
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32 if tiny else torch.bfloat16)
    try:
        with torch.device(device):
            model = Qwen3ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    with torch.no_grad():  # embeddings and head at a trained model's scale: a usable signal at once
        model.model.embed_tokens.weight.normal_(0, 1.0)
        model.lm_head.weight.normal_(0, 0.02)
    model.save_pretrained(path, safe_serialization=True)
    del model
    log(f"target built and saved in {time.time() - t0:.1f}s: {path}")


def make_data(path: str, n: int, seq: int | tuple[int, int], vocab: int) -> None:
    """``n`` synthetic sequences (arithmetic progressions of token ids) of ``seq`` tokens, or of a length drawn
    uniformly from the ``(low, high)`` range; nothing if ``path`` already holds data."""
    if os.path.isdir(path) and os.listdir(path):
        return
    import numpy as np

    os.makedirs(path, exist_ok=True)
    rng = np.random.default_rng(0)
    span = min(4096, vocab - 2)
    with open(os.path.join(path, "part-00000.jsonl"), "w") as f:
        for _ in range(n):
            length = int(rng.integers(seq[0], seq[1] + 1)) if isinstance(seq, tuple) else seq
            a, d = int(rng.integers(0, span)), int(rng.integers(1, 17))
            ids = ((a + d * np.arange(length)) % span + 1).tolist()
            f.write(json.dumps({"input_ids": ids}) + "\n")


def flags(a, target: str, data: str, out: str, tgpus: str, dgpus: str, steps: int) -> list[str]:
    return [
        "--target-model",
        target,
        "--data-dir",
        data,
        "--output-dir",
        out,
        "--target-gpus",
        tgpus,
        "--drafter-gpus",
        dgpus,
        "--num-draft-layers",
        str(a.layers),
        "--block-size",
        str(a.block),
        "--max-anchors",
        str(a.anchors),
        "--token-budget",
        str(a.seq),
        "--max-seq-len",
        str(a.seq),
        "--max-batch-size",
        "1",
        "--hs-queue-depth",
        str(a.depth),
        "--max-steps",
        str(steps),
        "--epochs",
        "4",
        "--log-every",
        "10",
        "--resume",
        "none",
        "--lr",
        "6e-4",
        "--warmup-ratio",
        "0.0002",
    ]


# -- stages alone ----------------------------------------------------------------------------------------
def alone(
    a,
    role: str,
    device: str,
    target: str | None,
    data: str | None,
    out_json: str,
    argv: list[str] | None = None,
    model=None,
    before_timed=None,
) -> None:
    """One stage alone, as the pipeline runs it; writes {tok_s, step_s, ...} to out_json. ``argv``: the
    trainer's flags (default: this bench's ``flags``); the stage follows them: the target captures the final
    hidden state too under ``--use-soft-labels``, the drafter trains on random hidden states of the target's
    width (and a random final hidden state under soft labels) and steps its optimizer every ``--grad-accum``
    micro-batches, on the micro-batches of the run's own packing plan. ``model``: the target, already on
    ``device`` and prepared for capture (built by the caller), instead of loading ``--target-model``;
    ``before_timed()``: called after the warm-up, before the timed micro-batches."""
    import torch

    from trainer.data.dataset import Plan, load_dir
    from trainer.run.flags import build_parser
    from trainer.run.settings import resolve
    from trainer.runtime.build import DrafterBuild
    from trainer.runtime.common import draft_config, log, micro_seed, quiet_transformers
    from trainer.runtime.gpu_meter import role_meter

    quiet_transformers()
    if argv is None:
        argv = flags(a, target, data, "/tmp/unused", "0", "0", 10**9)
    args = resolve(build_parser().parse_args(argv))  # the trainer's settings (its defaults for this target)
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.set_device(device)
    cfg = draft_config(args)
    ds = load_dir(args.data_dir, args.max_seq_len)
    plan = Plan.from_flags(ds, args)
    n, warm = a.alone_steps, a.alone_warmup
    soft = bool(args.use_soft_labels)
    A = args.grad_accum

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    if role == "target":
        from trainer.runtime.roles import TargetRole
        from trainer.target.capture import load_target

        if model is None:
            model = load_target(
                args.target_model,
                device,
                torch.bfloat16 if cuda else torch.float32,
                cfg.target_layer_ids,
                need_final_hidden=soft,
            )
        r = TargetRole(model, device, cfg.target_layer_ids, soft, role_meter(device, "target"))

        def step(g):
            return r(plan.batch(g)).tokens

        def steps(
            gs,
        ):  # as the pipeline's target worker runs it: the next micro-batch launched before a hand-off
            return sum(hb.tokens for hb in r.run(plan, gs))
    else:
        from trainer.runtime.hidden_queue import HiddenBatch

        b = DrafterBuild(args, device, None, "/tmp/unused/checkpoints", log)
        drole = b.role(b.state(), role_meter(device, "drafter"))
        C = cfg.num_captured * cfg.hidden_size
        gen = torch.Generator(device=device).manual_seed(0)
        dt = torch.bfloat16 if cuda else torch.float32
        T = args.token_budget
        hidden = torch.randn((1, T, C), generator=gen, device=device, dtype=dt)
        final = torch.randn((1, T, cfg.hidden_size), generator=gen, device=device, dtype=dt) if soft else None

        def step(g):
            mb = plan.batch(g)
            ids, lm, docs, _ = mb.to_tensors("cpu")
            k = mb.num_tokens
            hb = HiddenBatch(
                g, 0, k, hidden[:, :k], None if final is None else final[:, :k], ids.to(device), lm, docs
            )
            last = g % A == A - 1
            m = drole.micro_step(hb, 0.0, 1.0 / A, seed=micro_seed(0, g), sync=last)
            if last:  # the optimizer step and the per-step metrics read, as the pipeline does
                norm = drole.clip()
                drole.apply(1e-4)
                torch.cat([m["loss"].double().view(1), m["acc"].double(), norm.double().view(1)]).tolist()
            return k

        def steps(gs):
            return sum(step(g) for g in gs)

    t0 = time.perf_counter()
    for g in range(warm):
        step(g)
    sync()
    warm_s = time.perf_counter() - t0
    if before_timed is not None:
        before_timed()
    t0 = time.perf_counter()
    tokens = steps(range(warm, warm + n))
    sync()
    dt_s = time.perf_counter() - t0
    res = {
        "role": role,
        "device": device,
        "steps": n,
        "warmup_steps": warm,
        "warmup_s": warm_s,
        "tokens": tokens,
        "seconds": dt_s,
        "tok_s": tokens / dt_s,
        "peak_gib": torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None,
    }
    with open(out_json, "w") as f:
        json.dump(res, f)
    log(f"{role} alone on {device}: {res['tok_s']:.0f} tok/s ({n} steps, {dt_s:.2f}s; warm-up {warm_s:.1f}s)")


# -- pipeline runs ----------------------------------------------------------------------------------------
def analyse(metrics: str, skip: int, since: float = 0.0) -> dict:
    """Steady state: from the first throughput record after step ``skip`` to the last one before the stop.
    Own count = context tokens of the step records inside that window / its length; metrics = the
    throughput records' drafter tok/s integrated over the same window; step-bounded count
    (``tok_s_steps``) = the tokens of the steps after the window's first step up to its last one / the time
    between those two step records (no partial step at either edge: what a long step needs).
    ``since``: only the records from that time on (a resumed run appends to the same metrics.jsonl)."""
    recs = [r for r in load(metrics) if r.get("t", 0) >= since]
    steps = [r for r in recs if r["kind"] == "step"]
    thr = [r for r in recs if r["kind"] == "throughput"]
    stop_t = next(
        (r["t"] for r in recs if r.get("name") in ("stop_requested", "checkpoint_saving")), float("inf")
    )
    if len(steps) < skip + 3:
        return {"error": f"only {len(steps)} steps", "steps": len(steps)}
    after = [r for r in thr if r["t"] > steps[skip]["t"] and r["t"] <= min(stop_t, steps[-1]["t"])]
    if len(after) < 3:
        return {"error": "no steady-state window", "steps": len(steps)}
    t0, t1 = after[0]["t"], after[-1]["t"]
    win = [s for s in steps if t0 < s["t"] <= t1]
    own = sum(s["tokens"] for s in win) / (t1 - t0)
    metric = sum(
        sum(d["tok_s"] for d in r["devices"] if d["role"] == "drafter") * (r["t"] - q["t"])
        for q, r in zip(after, after[1:], strict=False)
    ) / (t1 - t0)
    bounded = [s for s in steps[skip:] if s["t"] <= stop_t]
    by_steps = (
        sum(s["tokens"] for s in bounded[1:]) / (bounded[-1]["t"] - bounded[0]["t"])
        if len(bounded) >= 2 and bounded[-1]["t"] > bounded[0]["t"]
        else None
    )
    depths = [r["queue"]["depth"] for r in after]
    busy: dict[str, list[float]] = {}
    for r in after:
        for d in r["devices"]:
            busy.setdefault(f"{d['role']} {d['device']}", []).append(d["busy"])
    losses = [s["loss"] for s in steps]
    start = next((r["t"] for r in recs if r.get("name") == "started"), thr[0]["t"] if thr else t0)
    series, last_t = [], -1e9
    for r in thr:  # queue depth over time, one sample every ~5 s (the plot has them all)
        if r["t"] - last_t >= 5.0:
            series.append([round(r["t"] - start, 1), r["queue"]["depth"]])
            last_t = r["t"]
    return {
        "steps": len(steps),
        "first_step": steps[0]["step"],
        "last_step": steps[-1]["step"],
        "window_steps": len(win),
        "window_s": t1 - t0,
        "tok_s_own": own,
        "tok_s_metrics": metric,
        "tok_s_steps": by_steps,
        "steps_window": [bounded[0]["step"], bounded[-1]["step"]] if bounded else None,
        "metrics_vs_own": metric / own if own else None,
        "first_step_after_s": steps[0]["t"] - start,
        "queue_depth": {
            "min": min(depths),
            "max": max(depths),
            "mean": sum(depths) / len(depths),
            "zero_fraction": sum(1 for d in depths if d == 0) / len(depths),
            "capacity": after[0]["queue"]["capacity"],
        },
        "queue_depth_series": series,
        "busy_mean": {k: sum(v) / len(v) for k, v in busy.items()},
        "loss_first": losses[0],
        "loss_first10_mean": sum(losses[:10]) / len(losses[:10]),
        "loss_last10_mean": sum(losses[-10:]) / len(losses[-10:]),
        "accept_len_last": steps[-1].get("accept_len"),
        "uuids": sorted({d["uuid"] for r in thr for d in r["devices"] if d.get("uuid")}),
    }


def count_steps(path: str, since: float = 0.0) -> int:
    try:
        with open(path) as f:
            return sum(1 for line in f if '"kind": "step"' in line and _t(line) >= since)
    except OSError:
        return 0


def _t(line: str) -> float:
    try:
        return float(json.loads(line).get("t", 0.0))
    except ValueError:
        return 0.0


def launch_until(
    a,
    name: str,
    argv: list[str],
    run: str,
    want_steps,
    seconds: float,
    env: dict | None = None,
    stop_timeout: float | None = None,
) -> dict:
    """``python -m trainer.pipeline ARGV`` (its log in OUT/train_NAME.log) until ``want_steps`` new step
    records (a number, or a callable ``(steps, elapsed_s) -> bool`` saying when to stop) or ``seconds``
    have passed, then SIGINT (the stop protocol: it saves and exits 0); waits up to ``stop_timeout`` s
    (default ``a.stop_timeout``, else 90) for the exit, then kills its process group (the launcher and its
    workers: it runs in a session of its own). Returns {exit, wall_s, stopped_by, command, since}: ``since``
    is the time this launch began (its records in a shared metrics.jsonl are those from then on)."""
    cmd = [sys.executable, "-m", "trainer.pipeline", *argv]
    log(f"pipeline {name}: {' '.join(cmd)}")
    env = dict(env or os.environ)
    env["PYTHONPATH"] = os.pathsep.join(x for x in (ROOT, env.get("PYTHONPATH", "")) if x)
    if stop_timeout is None:
        stop_timeout = getattr(a, "stop_timeout", 90)
    t0 = time.time()
    metrics = os.path.join(run, "metrics.jsonl")
    stopped_by = None
    with open(os.path.join(a.out, f"train_{name}.log"), "w") as logf:
        p = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True
        )
        while p.poll() is None:
            n = count_steps(metrics, t0)
            el = time.time() - t0
            done = want_steps(n, el) if callable(want_steps) else n >= want_steps
            if done or el > seconds:
                stopped_by = f"SIGINT after {n} steps, {el:.0f}s"
                p.send_signal(signal.SIGINT)
                break
            time.sleep(0.25)
        try:
            p.wait(timeout=stop_timeout)
        except subprocess.TimeoutExpired:
            stopped_by = (stopped_by or "") + f"; killed: no exit within {stop_timeout:.0f}s"
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
    res = {
        "exit": p.returncode,
        "wall_s": time.time() - t0,
        "stopped_by": stopped_by,
        "command": cmd,
        "since": t0,
    }
    log(f"pipeline {name}: exit {p.returncode}, {stopped_by}, {res['wall_s']:.0f}s")
    return res


def plot(metrics: str, png: str, title: str) -> None:
    try:
        subprocess.run(
            [sys.executable, os.path.join(ROOT, "bench", "plot_run.py"), metrics, png, "--title", title],
            check=True,
            timeout=60,
        )
    except Exception as e:  # noqa: BLE001 - the figures matter more than the plot
        log(f"plot failed: {e}")


def run_pipeline(
    a, name: str, tgpus: str, dgpus: str, want_steps: int, seconds: float, target: str, data: str
) -> dict:
    """Run the pipeline until ``want_steps`` steps or ``seconds`` have passed, then SIGINT it (the stop protocol:
    it saves and exits 0) and analyse its metrics.jsonl."""
    run = os.path.join(a.work, f"run_{name}")
    shutil.rmtree(run, ignore_errors=True)
    res = launch_until(a, name, flags(a, target, data, run, tgpus, dgpus, 100_000), run, want_steps, seconds)
    metrics = os.path.join(run, "metrics.jsonl")
    shutil.copy(metrics, os.path.join(a.out, f"metrics_{name}.jsonl"))
    res.update(analyse(metrics, a.skip))
    log(f"pipeline {name}: {json.dumps({k: v for k, v in res.items() if k != 'command'})}")
    plot(metrics, os.path.join(a.out, f"pipeline_{name}.png"), f"{name}: target {tgpus} -> drafter {dgpus}")
    shutil.rmtree(os.path.join(run, "checkpoints"), ignore_errors=True)
    return res


def spawn_alone(
    base: list[str], runs: list[tuple[str, str]], seconds: float, env: dict | None = None
) -> None:
    """``base + ["--alone", ROLE, DEVICE]`` for every (role, device) of ``runs``, all at once; kills those
    still running after ``seconds``."""
    env = dict(env or os.environ, PYTHONPATH=ROOT)
    end = time.time() + seconds
    ps = [subprocess.Popen([*base, "--alone", role, d], env=env) for role, d in runs]
    for p in ps:
        try:
            p.wait(timeout=max(1.0, end - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/bench_pipeline"))
    ap.add_argument("--work", default="/dev/shm/dflash_bench")
    ap.add_argument(
        "--parts",
        default="two,alone,one,alone1",
        help="in this order (alone: the stages on GPUs 0 "
        "and 1 at once; alone1: both on GPU 0, one after the other)",
    )
    ap.add_argument(
        "--two-s",
        type=float,
        default=200,
        help="at most this long for the two-GPU run (then SIGINT); "
        "start-up (target load + compile, drafter compile) took 63 s on H200s",
    )
    ap.add_argument("--one-s", type=float, default=200)
    ap.add_argument("--alone-s", type=float, default=120)
    ap.add_argument(
        "--deadline-s", type=float, default=0, help="skip or shorten parts to end within this (0: none)"
    )
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=5)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--anchors", type=int, default=512)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--sequences", type=int, default=600)
    ap.add_argument("--steps-two", type=int, default=400)
    ap.add_argument("--steps-one", type=int, default=200)
    ap.add_argument("--skip", type=int, default=20, help="steps left out of the steady-state window")
    ap.add_argument("--alone-steps", type=int, default=20)
    ap.add_argument("--alone-warmup", type=int, default=4)
    ap.add_argument("--timeout", type=int, default=420)
    ap.add_argument("--alone", nargs=2, metavar=("ROLE", "DEVICE"), help=argparse.SUPPRESS)
    ap.add_argument("--alone-tag", default="alone", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.tiny:
        a.seq, a.layers, a.block, a.anchors, a.sequences = 256, 1, 8, 32, 200
        a.steps_two, a.steps_one, a.skip, a.alone_steps, a.alone_warmup = 40, 30, 5, 5, 2
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(a.work, exist_ok=True)
    target, data = os.path.join(a.work, "target"), os.path.join(a.work, "data")
    if a.alone:
        alone(
            a, a.alone[0], a.alone[1], target, data, os.path.join(a.out, f"{a.alone_tag}_{a.alone[0]}.json")
        )
        return
    make_target(target, a.tiny)
    make_data(data, a.sequences, a.seq, (TINY if a.tiny else REF)["vocab_size"])
    dev = ("cpu", "cpu") if a.tiny else ("cuda:0", "cuda:1")
    gpus = ("cpu", "cpu") if a.tiny else ("0", "1")
    parts = a.parts.split(",")
    res_path = os.path.join(a.out, "results.json")
    res = {}
    if os.path.exists(res_path):
        with open(res_path) as f:
            res = json.load(f)
    import torch
    import transformers

    res.setdefault("env", {}).update(
        torch=torch.__version__,
        transformers=transformers.__version__,
        gpu=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    )

    def rates(tag):  # (target, drafter) tok/s of a stages-alone part, or None
        ta, da = (res.get(f"{tag}_{r}", {}).get("tok_s") for r in ("target", "drafter"))
        return (ta, da) if ta and da else None

    def save():
        if rates("alone") and res.get("two", {}).get("tok_s_own"):
            res["two"]["ratio_vs_min_alone"] = res["two"]["tok_s_own"] / min(rates("alone"))
        # the 1-GPU run against the stages alone on its own GPU (alone1), else on the 2-GPU run's GPUs
        one = "alone1" if rates("alone1") else "alone"
        if rates(one) and res.get("one", {}).get("tok_s_own"):
            ta, da = rates(one)
            res["one"]["ratio_vs_time_sum"] = res["one"]["tok_s_own"] * (1 / ta + 1 / da)
            res["one"]["ratio_against"] = one
        with open(res_path, "w") as f:
            json.dump(res, f, indent=1)

    t_start = time.time()
    for part in parts:
        if a.deadline_s:
            left = a.deadline_s - (time.time() - t_start) - 20  # a stop's checkpoint and the exit
            if left < 20:
                log(f"skipping {part}: {left + 20:.0f}s left of --deadline-s")
                continue
            a.two_s, a.one_s, a.alone_s = min(a.two_s, left), min(a.one_s, left), min(a.alone_s, left)
        if part == "two":
            res["two"] = run_pipeline(
                a, "two", gpus[0], "cpu,cpu" if a.tiny else gpus[1], a.steps_two, a.two_s, target, data
            )
        elif part == "one":
            res["one"] = run_pipeline(a, "one", gpus[0], gpus[0], a.steps_one, a.one_s, target, data)
        elif part in ("alone", "alone1"):
            # alone: the target on GPU 0 and the drafter on GPU 1 at once (the 2-GPU run's GPUs);
            # alone1: both on GPU 0, one after the other (the 1-GPU run's GPU)
            base = [
                sys.executable,
                os.path.abspath(__file__),
                "--out",
                a.out,
                "--work",
                a.work,
                "--alone-steps",
                str(a.alone_steps),
                "--alone-warmup",
                str(a.alone_warmup),
                "--alone-tag",
                part,
            ]
            base += ["--tiny"] if a.tiny else []
            runs = [("target", dev[0]), ("drafter", dev[1] if part == "alone" else dev[0])]
            groups = [runs] if part == "alone" else [[r] for r in runs]
            end = time.time() + a.alone_s
            for group in groups:
                spawn_alone(base, group, end - time.time())
            for r in ("target", "drafter"):
                try:
                    with open(os.path.join(a.out, f"{part}_{r}.json")) as f:
                        res[f"{part}_{r}"] = json.load(f)
                except OSError:
                    res[f"{part}_{r}"] = {"error": f"not done within {a.alone_s:.0f}s"}
        save()
    log("results: " + json.dumps(res, default=str)[:6000])


if __name__ == "__main__":
    main()
