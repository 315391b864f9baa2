"""The seeds' job: a Qwen3.6-27B-shaped hybrid target, the seeds' drafter flags, the real pipeline (issues 19, 23).

    python3 bench/bench_seeds.py --out /tmp/seeds --bundle $OUT              # 2 H200s: alone,two,resume
    python3 bench/bench_seeds.py --out /tmp/seeds --bundle $OUT --parts alone8,eight,resume8  # 8 H200s: 5 + 3
    PYTHONPATH=. python bench/bench_seeds.py --tiny --out /tmp/bs --parts alone,two,resume,alone8,eight,resume8

Everything under ``--work`` (default /dev/shm/dflash_seeds; a disk folder when /dev/shm has no room):
- ``target/``: a random-weight Qwen3.6-27B text model (``bench_hybrid.build``: the exact shape of
  /work/shared/targets/qwen3.6-27b-text.json, bf16, built on GPU 0), saved as safetensors shards written by
  parallel threads, text layout (``model.*``, ``lm_head.weight``; config.json of model_type qwen3_5_text),
  unless it exists (``target/.complete``). Built in its own process: GPU 0 is free again afterwards.
- ``data/``: synthetic packed data: ``--sequences`` documents of 1,024-8,192 tokens (uniform), each an
  arithmetic progression over 4,096 token ids (predictable: the drafter's loss falls).
The trainer's flags are the seeds' (issue 23): ``--token-budget 49152 --max-seq-len 8192 --max-batch-size 64
--block-size 32 --max-anchors 1024 --num-draft-layers 5 --gamma 10 --noise-start 0.05 --noise-end 0.01
--use-soft-labels --grad-accum 4`` (capture layers: the trainer's default for 64 layers, [1, 16, 31, 46, 61]);
the 1 + 1 runs take ``--grad-accum 1`` (``--grad-accum-two``: one drafter; the rate per token does not
depend on it, and a step every ~4 s instead of ~17 s gives a finer step-bounded rate and a short resume);
``--resume auto`` on every launch (a fresh run directory the first time: the same command twice).
Parts (``--parts``, in this order):
- ``alone``: the target stage alone on GPU 0 and the drafter stage alone on GPU 1, at once
  (``bench_pipeline.alone``: ``TargetRole.run`` over the run's own micro-batches; the drafter's micro-step,
  clip, AdamW and metrics read on random hidden states of the right shape); ``alone8``: the same on all 8
  GPUs at once, targets on 0-4 and drafters on 5-7 (each GPU's rate; the projection takes the means);
- ``two``: ``python -m trainer.pipeline --target-gpus 0 --drafter-gpus 1`` until the time budget leaves
  just enough for its stop and the resume, then SIGINT; ``eight``: ``--target-gpus 0,1,2,3,4
  --drafter-gpus 5,6,7``;
- ``resume`` / ``resume8``: the same command again (``--resume auto``) for ``--resume-steps`` steps, SIGINT,
  and the checks of ``check_resume`` (what "exactly" means on the GPU: its docstring);
then the projection to 8 GPUs (``bench/projection.py``) from the stage rates and the measured efficiency,
written with the README rows to OUT/projection.md and OUT/readme_rows.md.
Results: OUT/results.json (written after every part), the runs' train logs, metrics.jsonl copies, plots
(``bench/plot_run.py``), each alone process's log; ``--bundle DIR`` (the device tool's $OUT, which brings back
8 files at most): the key files and OUT as seeds.tar.gz, after every part. ``--deadline-s``: the whole script
ends within it (parts shortened or skipped; a pipeline run is stopped early enough for its save and what follows).
``--tiny``: a tiny Qwen3.5-shaped target, CPU processes (``two``: 1 + 1 workers, ``eight``: 2 + 1,
``--launch multi``), small flags: the whole script end to end in a few minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))
import bench_pipeline as bp  # noqa: E402  (this folder: the stages-alone measurement, the run analysis)
import projection  # noqa: E402

SEEDS = dict(
    token_budget=49152,
    max_seq_len=8192,
    max_batch_size=64,
    block_size=32,
    max_anchors=1024,
    num_draft_layers=5,
    gamma=10,
    noise_start=0.05,
    noise_end=0.01,
    grad_accum=4,
)
TINY_SEEDS = dict(SEEDS, token_budget=512, max_seq_len=128, block_size=8, max_anchors=16)
DOC_LENGTHS = (1024, 8192)
TINY_DOC_LENGTHS = (16, 128)
# (target devices, drafter devices) of each run; tiny: CPU worker processes
SPLITS = {"two": ("0", "1"), "eight": ("0,1,2,3,4", "5,6,7")}
TINY_SPLITS = {"two": ("cpu", "cpu"), "eight": ("cpu,cpu", "cpu")}
ALONE_OF = {"two": "alone", "eight": "alone8"}
RESUME_OF = {"resume": "two", "resume8": "eight"}
PARTS = ("alone", "two", "resume", "alone8", "eight", "resume8")
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
CKPT_BYTES = (
    30e9  # a drafter checkpoint at this shape (fp32 weights + AdamW + bf16 export ~ 26 GB), rounded up
)


def log(msg: str) -> None:
    print(f"[seeds {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# -- target and data ------------------------------------------------------------------------------------------
def save_sharded(model, path: str, shard_bytes: float = 4e9, threads: int = 8) -> int:
    """The model's state dict as safetensors shards + index, written by ``threads`` threads at once (each
    copies its shard's tensors to the host and writes them); returns the bytes written."""
    from concurrent.futures import ThreadPoolExecutor

    from safetensors.torch import save_file

    sd = model.state_dict()
    shards: list[list[str]] = [[]]
    size = 0
    for k, v in sd.items():
        n = v.numel() * v.element_size()
        if shards[-1] and size + n > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(k)
        size += n
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]

    def write(i: int) -> None:
        tensors = {k: sd[k].detach().to("cpu").contiguous() for k in shards[i]}
        save_file(tensors, os.path.join(path, names[i]), metadata={"format": "pt"})

    with ThreadPoolExecutor(threads) as ex:
        list(ex.map(write, range(len(shards))))
    total = sum(v.numel() * v.element_size() for v in sd.values())
    index = {
        "metadata": {"total_size": total},
        "weight_map": {k: names[i] for i, ks in enumerate(shards) for k in ks},
    }
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=1)
    return total


def complete(path: str) -> bool:
    return os.path.exists(os.path.join(path, ".complete"))


def build_model(path: str, tiny: bool, device: str):
    """The random-weight target on ``device``, its config.json written to ``path`` (the weights not yet)."""
    import torch
    from bench_hybrid import build

    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    model, cfg = build(tiny, "cpu" if tiny else "cuda")
    with torch.no_grad():  # embeddings and head at a trained model's scale (as bench_pipeline's target)
        model.get_input_embeddings().weight.normal_(0, 1.0)
        model.get_output_embeddings().weight.normal_(0, 0.02)
    cfg.architectures = [type(model).__name__]
    cfg.save_pretrained(path)
    return model


def save_weights(model, path: str, tiny: bool, t_build: float) -> dict:
    """The weights (``save_sharded``), then ``path/.complete``; the timings, also in ``path/../build.json``."""
    t1 = time.time()
    nbytes = save_sharded(model, path, shard_bytes=4e9 if not tiny else 2e5)
    saved = time.time() - t1
    with open(os.path.join(path, ".complete"), "w") as f:
        f.write("ok\n")
    res = {"build_s": t_build, "save_s": saved, "bytes": nbytes, "gb_per_s": nbytes / 1e9 / max(saved, 1e-9)}
    with open(os.path.join(os.path.dirname(path), "build.json"), "w") as f:
        json.dump(res, f)
    log(f"target built in {t_build:.1f}s, {nbytes / 1e9:.1f} GB saved in {saved:.1f}s: {path}")
    return res


def build_target(path: str, tiny: bool, device: str) -> dict:
    """The random-weight target in ``path`` (text layout); ``path/.complete`` once every file is written."""
    t0 = time.time()
    model = build_model(path, tiny, device)
    return save_weights(model, path, tiny, time.time() - t0)


def choose_work(a, need: float) -> dict:
    """Make sure ``a.work``'s file system has ``need`` bytes free: on /dev/shm, as root, grow it (remount)
    when it is smaller (the machine's RAM is larger than what tmpfs took at boot); else a disk folder."""
    os.makedirs(a.work, exist_ok=True)
    used = sum(
        os.path.getsize(os.path.join(d, f))
        for d, _, fs in os.walk(a.work)
        for f in fs
        if not os.path.islink(os.path.join(d, f))
    )
    free = shutil.disk_usage(a.work).free
    info = {"work": a.work, "free_gb": free / 1e9, "need_gb": need / 1e9, "have_gb": used / 1e9}
    if free + used >= need or a.tiny:
        return info
    if a.work.startswith("/dev/shm") and hasattr(os, "geteuid") and os.geteuid() == 0:
        total = shutil.disk_usage("/dev/shm").total
        want = int((total + need - free - used) / 2**30) + 16
        r = subprocess.run(
            ["mount", "-o", f"remount,size={want}G", "/dev/shm"], capture_output=True, text=True
        )
        info["remount"] = f"size={want}G: rc {r.returncode} {r.stderr.strip()[:200]}"
        free = shutil.disk_usage(a.work).free
        info["free_gb_after"] = free / 1e9
        if free + used >= need:
            return info
    disk = a.disk_work
    os.makedirs(disk, exist_ok=True)
    info["fallback"] = disk
    info["disk_free_gb"] = shutil.disk_usage(disk).free / 1e9
    log(f"{a.work} has {free / 1e9:.0f} GB free, {need / 1e9:.0f} GB needed: working in {disk} instead")
    a.work = disk
    return info


# -- the trainer's flags ---------------------------------------------------------------------------------------
def seeds_argv(a, run: str, split: str) -> list[str]:
    s = TINY_SEEDS if a.tiny else SEEDS
    tgpus, dgpus = (TINY_SPLITS if a.tiny else SPLITS)[split]
    accum = a.grad_accum_two if split == "two" else s["grad_accum"]
    argv = [
        "--target-model",
        os.path.join(a.work, "target"),
        "--data-dir",
        os.path.join(a.work, "data"),
        "--output-dir",
        run,
        "--target-gpus",
        tgpus,
        "--drafter-gpus",
        dgpus,
        "--token-budget",
        str(s["token_budget"]),
        "--max-seq-len",
        str(s["max_seq_len"]),
        "--max-batch-size",
        str(s["max_batch_size"]),
        "--block-size",
        str(s["block_size"]),
        "--max-anchors",
        str(s["max_anchors"]),
        "--num-draft-layers",
        str(s["num_draft_layers"]),
        "--gamma",
        str(s["gamma"]),
        "--noise-start",
        str(s["noise_start"]),
        "--noise-end",
        str(s["noise_end"]),
        "--use-soft-labels",
        "--grad-accum",
        str(accum),
        "--epochs",
        str(a.epochs),
        "--log-every",
        "1",
        "--resume",
        "auto",
    ]
    if a.tiny:  # CPU roles in worker processes of their own, as on GPUs
        argv += ["--launch", "multi"]
    return argv


def environment(a) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for k, v in NCCL_ENV.items():
        env.setdefault(k, v)
    if a.shared_compile_cache:
        # every process (stages alone, both launches) shares one compile cache: the pipeline's first launch
        # finds the target's and drafter's graphs (and fla's autotuning) the stages alone compiled
        cache = os.path.join(a.work, "compile_cache")
        env.update(
            DFLASH_COMPILE_CACHE="0",
            TORCHINDUCTOR_CACHE_DIR=os.path.join(cache, "inductor"),
            TRITON_CACHE_DIR=os.path.join(cache, "triton"),
            TORCHINDUCTOR_FX_GRAPH_CACHE="1",
            TORCHINDUCTOR_AUTOGRAD_CACHE="1",
            TRITON_CACHE_AUTOTUNING="1",
        )
    return env


# -- stages alone ------------------------------------------------------------------------------------------
def devices_of(a, split: str) -> tuple[list[str], list[str]]:
    t, d = (TINY_SPLITS if a.tiny else SPLITS)[split]
    if a.tiny:
        return ["cpu"] * len(t.split(",")), ["cpu"] * len(d.split(","))
    return [f"cuda:{i}" for i in t.split(",")], [f"cuda:{i}" for i in d.split(",")]


def run_alone(a, part: str, seconds: float, env: dict) -> dict:
    split = "two" if part == "alone" else "eight"
    tdev, ddev = devices_of(a, split)
    runs = [("target", d, i) for i, d in enumerate(tdev)] + [("drafter", d, i) for i, d in enumerate(ddev)]
    procs = []
    end = time.time() + seconds
    for role, dev, i in runs:
        tag = f"{part}_{role}{i}"
        cmd = [sys.executable, os.path.abspath(__file__), "--out", a.out, "--work", a.work]
        cmd += ["--alone", role, dev, tag, "--alone-split", split]
        cmd += ["--alone-steps", str(a.alone_steps), "--alone-warmup", str(a.alone_warmup)]
        cmd += ["--tiny"] if a.tiny else []
        cmd += ["--grad-accum-two", str(a.grad_accum_two), "--alone-s", str(seconds)]
        f = open(os.path.join(a.out, f"{tag}.log"), "w")  # noqa: SIM115 - closed below
        procs.append((tag, subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT), f))
    log(f"{part}: {len(procs)} processes, at most {seconds:.0f}s")
    # the first target (it builds the target) and the drafters first; the other targets (8 GPUs: they wait
    # for the saved target, then load it) get at most --alone-extra-s more once those are done
    primary = [x for x in procs if x[0].endswith("_target0") or "_drafter" in x[0]]
    others = [x for x in procs if x not in primary]
    for group, limit in ((primary, lambda: end), (others, lambda: min(end, time.time() + a.alone_extra_s))):
        stop_at = limit()
        for tag, p, f in group:
            try:
                p.wait(timeout=max(1.0, stop_at - time.time()))
            except subprocess.TimeoutExpired:
                log(f"{tag}: not done in time: killed")
                p.kill()
                p.wait()
            f.close()
    out: dict = {"target": [], "drafter": []}
    for tag, p, _ in procs:
        role = "target" if "_target" in tag else "drafter"
        try:
            with open(os.path.join(a.out, f"{tag}.json")) as fh:
                out[role].append(json.load(fh))
        except OSError:
            out[role].append({"error": f"no result (exit {p.returncode}); see {tag}.log", "tag": tag})
    for role, key in (("target", "capture_tok_s"), ("drafter", "drafter_tok_s")):
        got = [r["tok_s"] for r in out[role] if "tok_s" in r]
        out[key] = sum(got) / len(got) if got else None  # the mean over the GPUs measured
        out[f"{role}_gpus_measured"] = len(got)
    log(f"{part}: capture {out['capture_tok_s']} tok/s per GPU, drafter {out['drafter_tok_s']} tok/s per GPU")
    return out


def alone_child(a) -> None:
    """``--alone ROLE DEVICE TAG``: one stage alone (``bench_pipeline.alone``) with the seeds' flags. The first
    target process builds the target when there is none: on its GPU, saved by threads while it compiles and
    warms up (done before its timed micro-batches), and measures that model (no second read); the other
    processes wait for the saved target."""
    role, dev, tag = a.alone
    argv = seeds_argv(a, "/tmp/unused-" + tag, a.alone_split)
    path = os.path.join(a.work, "target")
    out_json = os.path.join(a.out, f"{tag}.json")
    if role == "target" and tag.endswith("_target0") and not complete(path):
        import threading

        from trainer.target.hybrid import prepare_hybrid

        t0 = time.time()
        try:
            model = build_model(path, a.tiny, dev)
        except BaseException as e:
            failed(path, e)
            raise
        t_build = time.time() - t0
        err: list = []

        def save():  # a non-daemon thread: the process ends after it, even when the measurement fails
            try:
                save_weights(model, path, a.tiny, t_build)
            except BaseException as e:  # noqa: BLE001 - reported by the join below
                failed(path, e)
                err.append(e)

        th = threading.Thread(target=save, name="save-target")
        th.start()

        def joined():
            th.join()
            if err:
                raise err[0]

        if prepare_hybrid(model) is None:  # what load_target does on this device
            raise RuntimeError("the built target does not qualify for the hybrid capture path")
        bp.alone(a, role, dev, None, None, out_json, argv=argv, model=model, before_timed=joined)
        return
    end = time.time() + a.alone_s
    while not complete(path):
        if os.path.exists(os.path.join(path, ".failed")):
            with open(os.path.join(path, ".failed")) as f:
                raise SystemExit(f"the target could not be built: {f.read()}")
        if time.time() > end:
            raise SystemExit(f"no target in {path} after {a.alone_s:.0f}s")
        time.sleep(0.5)
    bp.alone(a, role, dev, None, None, out_json, argv=argv)


def failed(path: str, e: BaseException) -> None:
    """Tell the processes waiting for the target that it will not come."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, ".failed"), "w") as f:
        f.write(f"{type(e).__name__}: {e}\n")


# -- pipeline runs ------------------------------------------------------------------------------------------
def records(metrics: str) -> list[dict]:
    return bp.load(metrics) if os.path.exists(metrics) else []


def resume_steps(a, split: str) -> int:
    if a.resume_steps is not None:
        return a.resume_steps
    return 2 if split == "eight" else 3


def run_part(a, part: str, env: dict, t_end: float, resume_follows: bool) -> dict:
    """A fresh run of ``part``'s split, stopped by SIGINT so that its save, and the resume when one follows,
    end by ``t_end``: it runs until ``t_end`` less its own stop (``--save-est-s`` + ``--exit-s``) less the
    resume's start-up (as long as this run's), steps and stop. When that would leave less than
    ``--min-window-s`` of steady state after its first step, the resume is given up (``resume_dropped``)
    and the time goes to the steady state."""
    run = os.path.join(a.work, f"run_{part}")
    shutil.rmtree(run, ignore_errors=True)
    argv = seeds_argv(a, run, part)
    seen: dict = {"resume": resume_follows}
    own_stop = a.save_est_s + a.exit_s

    def stop_now(n: int, el: float) -> bool:
        now = time.time()
        if n >= 1 and "first" not in seen:
            seen["first"] = el
        if n >= 2:
            seen["step_s"] = (el - seen["first"]) / (n - 1)
        if n >= a.run_steps:
            return True
        if n == 0:  # still starting: wait as long as its own stop allows
            return now >= t_end - own_stop
        reserve = own_stop
        if seen["resume"]:
            step_s = seen.get("step_s", a.step_est_s)
            reserve += seen["first"] + (resume_steps(a, part) + 1) * step_s + a.save_est_s + a.exit_s
            if t_end - reserve - (now - el + seen["first"]) < a.min_window_s:
                seen["resume"] = False  # too little time for both: the steady state first
                reserve = own_stop
        return now >= t_end - reserve

    res = bp.launch_until(
        a,
        part,
        argv,
        run,
        stop_now,
        max(10.0, min(a.run_s, t_end - time.time())),
        env=env,
        stop_timeout=max(30.0, min(a.stop_timeout, t_end + a.grace_s - time.time())),
    )
    res["split"] = " -> ".join((TINY_SPLITS if a.tiny else SPLITS)[part])
    res["resume_dropped"] = resume_follows and not seen["resume"]
    metrics = os.path.join(run, "metrics.jsonl")
    if os.path.exists(metrics):
        shutil.copy(metrics, os.path.join(a.out, f"metrics_{part}.jsonl"))
        res.update(bp.analyse(metrics, a.skip, since=res["since"]))
        bp.plot(metrics, os.path.join(a.out, f"pipeline_{part}.png"), f"{part}: target {res['split']}")
    res.update(stop_facts(run, res["since"]))
    return res


def stop_facts(run: str, since: float) -> dict:
    """What a launch's stop left: its events in order, the checkpoints, the saved step."""
    from trainer.run import checkpoint

    recs = [r for r in records(os.path.join(run, "metrics.jsonl")) if r.get("t", 0) >= since]
    events = [r for r in recs if r.get("kind") == "event"]
    saved = [e for e in events if e.get("name") == "checkpoint_saved"]
    root = os.path.join(run, "checkpoints")
    steps = [r["step"] for r in recs if r.get("kind") == "step"]
    out = {
        "events": [e.get("name") for e in events],
        "checkpoints_saved": len(saved),
        "checkpoint_step": saved[-1]["step"] if saved else None,
        "checkpoint_s": saved[-1].get("seconds") if saved else None,
        "checkpoint_bytes": saved[-1].get("bytes") if saved else None,
        "checkpoint_dirs": checkpoint.list_steps(root),
        "stopped": next(
            ({k: e.get(k) for k in ("reason", "exit_code")} for e in events if e.get("name") == "stopped"),
            None,
        ),
        "last_step": steps[-1] if steps else None,
        "startup": [
            {k: r.get(k) for k in ("phase", "seconds", "state", "device") if k in r}
            for r in recs
            if r.get("kind") == "startup"
            and r.get("phase") in ("first_step", "compile_cache", "target_loaded")
        ],
    }
    latest = checkpoint.latest(root)
    out["latest"] = os.path.basename(latest) if latest else None
    return out


def resume_part(a, part: str, env: dict, t_end: float, first: dict) -> dict:
    base = RESUME_OF[part]
    run = os.path.join(a.work, f"run_{base}")
    if not first or first.get("exit") != 0 or not first.get("checkpoint_step"):
        return {"skipped": f"the {base} run did not stop with a checkpoint"}
    if first.get("resume_dropped"):
        return {"skipped": f"too little time left after the {base} run's steady state (--deadline-s)"}
    argv = seeds_argv(a, run, base)
    save_s = first.get("checkpoint_s") or a.save_est_s

    def stop_now(n: int, el: float) -> bool:  # by the deadline even before a step (nothing new to save then)
        return n >= resume_steps(a, base) or time.time() >= t_end - save_s - a.exit_s

    res = bp.launch_until(
        a,
        part,
        argv,
        run,
        stop_now,
        max(10.0, t_end - time.time()),
        env=env,
        stop_timeout=max(30.0, min(a.stop_timeout, t_end + a.grace_s - time.time())),
    )
    res.update(stop_facts(run, res["since"]))
    metrics = os.path.join(run, "metrics.jsonl")
    if os.path.exists(metrics):
        shutil.copy(metrics, os.path.join(a.out, f"metrics_{base}_and_{part}.jsonl"))
        bp.plot(
            metrics, os.path.join(a.out, f"pipeline_{base}_and_{part}.png"), f"{base}, SIGINT, then {part}"
        )
    try:
        res["check"] = check_resume(a, run, base, first["since"], res["since"])
    except Exception as e:  # noqa: BLE001 - reported, never fatal
        res["check"] = {"error": f"{type(e).__name__}: {e}"}
        traceback.print_exc()
    return res


def check_resume(a, run: str, split: str, since1: float, since2: float) -> dict:
    """ "Exactly", as checked on the GPU run (the bit-for-bit comparison with an uninterrupted run is the CPU
    test's, tests/trainer/test_pipeline_stop_resume.py, which the same code passes): after the first launch's
    SIGINT at step k,
    - stop: its events are started, stop_requested, checkpoint_saving, checkpoint_saved, stopped (exit 0) and
      one checkpoint exists, of step k = its last step record, ``latest`` naming it;
    - numbering: the second launch's ``started`` event is at step k and its step records are k+1, k+2, ...;
    - data position: the checkpoint's cursor is k x grad_accum x drafters, and every step record of both
      launches holds the tokens of exactly the micro-batches an uninterrupted run trains at that step (the
      packing plan, recomputed here from the data); the anchor and noise RNG is reseeded from the micro-batch
      index, so the same position means the same draws;
    - schedule: every record's lr and noise are the schedule's value at its step (not restarted), and
      total_steps is the same in both launches;
    - optimizer state: AdamW's step count in the second launch's checkpoint is its step k2 (a fresh optimizer
      would count k2 - k), and in the first checkpoint k;
    - weights: the resumed first loss against the first launch's last losses and its very first one."""
    from trainer.data.dataset import Plan, load_dir
    from trainer.run import checkpoint
    from trainer.run.flags import build_parser
    from trainer.run.schedule import lr_at, noise_at

    args = build_parser().parse_args(seeds_argv(a, run, split))
    recs = records(os.path.join(run, "metrics.jsonl"))
    one = [r for r in recs if since1 <= r.get("t", 0) < since2]
    two = [r for r in recs if r.get("t", 0) >= since2]
    s1 = [r for r in one if r.get("kind") == "step"]
    s2 = [r for r in two if r.get("kind") == "step"]
    ev1 = [r["name"] for r in one if r.get("kind") == "event"]
    started2 = next((r for r in two if r.get("name") == "started"), {})
    root = os.path.join(run, "checkpoints")
    k = s1[-1]["step"] if s1 else None
    ck1 = os.path.join(root, checkpoint.step_dir_name(k)) if k else None
    man1 = checkpoint.read_manifest(ck1) if ck1 and os.path.exists(ck1) else {}
    replicas = len((TINY_SPLITS if a.tiny else SPLITS)[split][1].split(","))
    A = args.grad_accum
    ds = load_dir(args.data_dir, args.max_seq_len)
    plan = Plan.from_flags(ds, args)

    def expected_tokens(step: int) -> int:
        g0 = (step - 1) * A * replicas
        return sum(plan.batch(g).num_tokens for g in range(g0, g0 + A * replicas))

    def schedule_ok(s: dict) -> bool:
        total = s["total_steps"]
        lr = lr_at(s["step"] - 1, base_lr=args.lr, total_steps=total, warmup_ratio=args.warmup_ratio)
        nz = noise_at(s["step"] - 1, start=args.noise_start, end=args.noise_end, total_steps=total)
        return abs(s["lr"] - lr) <= 1e-12 * max(1.0, abs(lr)) and abs(s["noise"] - nz) <= 1e-12

    def adam_steps(ck: str) -> list[float]:
        import torch

        st = torch.load(os.path.join(ck, "state.pt"), map_location="cpu", weights_only=False, mmap=True)
        return sorted({float(v["step"]) for v in st["optimizer"]["state"].values() if "step" in v})

    k2 = s2[-1]["step"] if s2 else None
    ck2 = os.path.join(root, checkpoint.step_dir_name(k2)) if k2 else None
    checks = {
        "stop_events": ev1
        == ["started", "stop_requested", "checkpoint_saving", "checkpoint_saved", "stopped"],
        "one_checkpoint_of_step_k": man1.get("step") == k and ev1.count("checkpoint_saved") == 1,
        "resumed_at_k": started2.get("step") == k,
        "steps_continue": bool(s2) and [s["step"] for s in s2] == list(range(k + 1, k + 1 + len(s2))),
        "cursor": man1.get("cursor") == (k or 0) * A * replicas,
        "tokens_launch1": all(s["tokens"] == expected_tokens(s["step"]) for s in s1),
        "tokens_launch2": bool(s2) and all(s["tokens"] == expected_tokens(s["step"]) for s in s2),
        "schedule": all(schedule_ok(s) for s in s1 + s2),
        "total_steps_same": len({s["total_steps"] for s in s1 + s2}) == 1,
    }
    out: dict = {"k": k, "k2": k2, "replicas": replicas, "grad_accum": A, "cursor": man1.get("cursor")}
    try:
        out["adam_steps_ckpt1"] = adam_steps(ck1)
        out["adam_steps_ckpt2"] = adam_steps(ck2) if ck2 and os.path.exists(ck2) else None
        checks["optimizer_state"] = out["adam_steps_ckpt1"] == [float(k)] and out["adam_steps_ckpt2"] == [
            float(k2)
        ]
    except Exception as e:  # noqa: BLE001
        out["adam_error"] = f"{type(e).__name__}: {e}"
        checks["optimizer_state"] = False
    if s1 and s2:
        last = [s["loss"] for s in s1[-5:]]
        out["loss"] = {
            "launch1_first": s1[0]["loss"],
            "launch1_last5_mean": sum(last) / len(last),
            "resumed_first": s2[0]["loss"],
        }
    out["checks"] = checks
    out["all_passed"] = all(checks.values())
    log(f"resume checks: {json.dumps(checks)}")
    return out


# -- results ------------------------------------------------------------------------------------------------
def efficiency_of(res: dict, run: str, a) -> dict | None:
    """A run's steady state against min(its stages alone) (1 + 1) or the split's projection (T + D)."""
    r, al = res.get(run) or {}, res.get(ALONE_OF[run]) or {}
    rate = r.get("tok_s_steps") or r.get("tok_s_own")
    cap, dr = al.get("capture_tok_s"), al.get("drafter_tok_s")
    if not (rate and cap and dr):
        return None
    tg, dg = (TINY_SPLITS if a.tiny else SPLITS)[run]
    nt, nd = len(tg.split(",")), len(dg.split(","))
    bound = min(nt * cap, nd * dr)
    return {"rate": rate, "bound": bound, "efficiency": rate / bound, "targets": nt, "drafters": nd}


def update_projection(res: dict, a) -> None:
    for run, key in (("two", "projection"), ("eight", "projection8")):
        al = res.get(ALONE_OF[run]) or {}
        if not (al.get("capture_tok_s") and al.get("drafter_tok_s")):
            continue
        eff = efficiency_of(res, run, a)
        if eff:
            res[run]["vs_alone"] = eff
        e = eff["efficiency"] if eff else 1.0
        p = projection.project(al["capture_tok_s"], al["drafter_tok_s"], e, n=8)
        p["source"] = (
            f"rates from `{ALONE_OF[run]}`, efficiency from `{run}`"
            if eff
            else f"rates from `{ALONE_OF[run]}`, efficiency 1.0 (no `{run}` run)"
        )
        res[key] = p


def readme_rows(res: dict) -> str:
    """bench/README.md rows (Markdown) from the results: the lead pastes them."""
    env = res.get("env", {})
    lines = [
        f"Machine: {env.get('gpus')} x {env.get('gpu')}, torch {env.get('torch')}, transformers "
        f"{env.get('transformers')}, fla {env.get('fla')}, {env.get('date')}; work in {res.get('work', {}).get('work')}.",
        "",
        "| what | goal | measured | notes |",
        "|---|---|---|---|",
    ]
    b = res.get("build") or {}
    if "save_s" in b:
        lines.append(
            f"| target built and saved | | {b['bytes'] / 1e9:.1f} GB in {b['build_s']:.1f} s + {b['save_s']:.1f} s ({b['gb_per_s']:.2f} GB/s) | random weights, safetensors shards, parallel writes |"
        )
    for part in ("alone", "alone8"):
        al = res.get(part)
        if not al:
            continue
        for role in ("target", "drafter"):
            for r in al.get(role, []):
                if "tok_s" in r:
                    pk = f", peak {r['peak_gib']:.1f} GiB" if r.get("peak_gib") else ""
                    lines.append(
                        f"| {role} stage alone (`{part}`, {r['device']}) | | **{r['tok_s']:,.0f} tok/s** | {r['steps']} timed micro-batches after {r['warmup_steps']} ({r['warmup_s']:.0f} s){pk} |"
                    )
                else:
                    lines.append(f"| {role} stage alone (`{part}`) | | failed | {r.get('error')} |")
    for run in ("two", "eight"):
        r = res.get(run)
        if not r:
            continue
        if "tok_s_own" not in r:
            lines.append(
                f"| `{run}` pipeline | | failed: {r.get('error') or r.get('stopped_by')} | exit {r.get('exit')} |"
            )
            continue
        eff = r.get("vs_alone") or {}
        goal = ">= 0.9" if run == "two" else ">= 0.9 of the projection"
        ratio = f" = **{eff['efficiency']:.3f}** of {eff['bound']:,.0f}" if eff else ""
        q = r["queue_depth"]
        lines.append(
            f"| `{run}` pipeline steady state ({r.get('split')}) | {goal} | **{r['tok_s_steps'] or r['tok_s_own']:,.0f} tok/s**{ratio} | "
            f"steps {r['steps_window'][0]}-{r['steps_window'][1]} (step-bounded); own count {r['tok_s_own']:,.0f}, metrics {r['tok_s_metrics']:,.0f}; "
            f"first step {r['first_step_after_s']:.0f} s after start; busy {', '.join(f'{k} {v:.3f}' for k, v in r['busy_mean'].items())} |"
        )
        lines.append(
            f"| `{run}` queue depth | | min {q['min']}, mean {q['mean']:.2f}, max {q['max']} of {q['capacity']}; 0 in {100 * q['zero_fraction']:.0f}% | plot: pipeline_{run}.png |"
        )
        lines.append(
            f"| `{run}` stop | exit 0, one checkpoint | exit {r.get('exit')}, {r.get('checkpoints_saved')} checkpoint(s) of step {r.get('checkpoint_step')} "
            f"({(r.get('checkpoint_bytes') or 0) / 1e9:.1f} GB in {r.get('checkpoint_s') or 0:.1f} s) | events {', '.join(r.get('events', []))} |"
        )
        lines.append(
            f"| `{run}` loss | falls | {r['loss_first10_mean']:.2f} (first 10) -> {r['loss_last10_mean']:.2f} (last 10 of {r['steps']}) | |"
        )
    for part in ("resume", "resume8"):
        r = res.get(part)
        if not r:
            continue
        c = r.get("check") or {}
        if "checks" in c:
            failed = [k for k, v in c["checks"].items() if not v]
            lines.append(
                f"| `{part}`: `--resume auto` continues exactly | all checks | **{'all passed' if c['all_passed'] else 'FAILED: ' + ', '.join(failed)}** | "
                f"stopped at step {c['k']}, resumed at {c['k'] + 1 if c['k'] else None}..{c['k2']}, exit {r.get('exit')}; AdamW steps {c.get('adam_steps_ckpt1')} -> {c.get('adam_steps_ckpt2')}; "
                f"loss {json.dumps(c.get('loss'))} |"
            )
        else:
            lines.append(f"| `{part}` | | {r.get('skipped') or c.get('error')} | |")
    return "\n".join(lines) + "\n"


def write_reports(res: dict, a) -> None:
    md = [projection.markdown(p, p.get("source", k)) for k, p in projection.from_results(res)]
    with open(os.path.join(a.out, "projection.md"), "w") as f:
        f.write("\n".join(md) if md else "no stage rates measured: no projection\n")
    with open(os.path.join(a.out, "readme_rows.md"), "w") as f:
        f.write(readme_rows(res))


def bundle(a) -> None:
    """``--bundle DIR`` (the device tool's $OUT, which brings back at most 8 files): the key files as they are
    (results.json, projection.md, readme_rows.md, the plots of the 1 + 1 or 5 + 3 run and of its resume)
    and everything in ``--out`` as seeds.tar.gz; called after every part, so a cut-off call still returns
    what was done."""
    if not a.bundle:
        return
    import tarfile

    os.makedirs(a.bundle, exist_ok=True)
    keep = ["results.json", "projection.md", "readme_rows.md"]
    for run, res in (("two", "resume"), ("eight", "resume8")):
        keep += [f"pipeline_{run}.png", f"pipeline_{run}_and_{res}.png"]
    for name in keep:
        src = os.path.join(a.out, name)
        if os.path.exists(src) and os.path.abspath(a.out) != os.path.abspath(a.bundle):
            shutil.copy(src, os.path.join(a.bundle, name))
    tmp = os.path.join(a.bundle, ".seeds.tar.gz.tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(a.out, arcname="seeds")
    os.replace(tmp, os.path.join(a.bundle, "seeds.tar.gz"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="/tmp/bench_seeds", help="every file the run writes")
    ap.add_argument(
        "--bundle",
        default=None,
        help="also copy the key files and a tar.gz of --out here (the device tool's $OUT: 8 files at most)",
    )
    ap.add_argument("--work", default="/dev/shm/dflash_seeds")
    ap.add_argument("--disk-work", default="/var/tmp/dflash_seeds", help="used when --work has no room")
    ap.add_argument("--parts", default="alone,two,resume", help=f"comma-separated, of {','.join(PARTS)}")
    ap.add_argument("--deadline-s", type=float, default=525, help="end within this (0: no limit)")
    ap.add_argument("--alone-s", type=float, default=200, help="at most this long for the stages alone")
    ap.add_argument("--run-s", type=float, default=400, help="at most this long for a pipeline run")
    ap.add_argument("--run-steps", type=int, default=10_000, help="stop a pipeline run after this many steps")
    ap.add_argument(
        "--resume-steps", type=int, default=None, help="steps of the resumed launch (3; 8 GPUs: 2)"
    )
    ap.add_argument("--skip", type=int, default=2, help="steps left out of the steady-state window")
    ap.add_argument("--save-est-s", type=float, default=45, help="a checkpoint's save, planned for")
    ap.add_argument("--exit-s", type=float, default=15, help="a stop's exit after the save, planned for")
    ap.add_argument("--startup-est-s", type=float, default=100, help="launch to first step, planned for")
    ap.add_argument("--step-est-s", type=float, default=5, help="a step, planned for (1 + 1: ~4.2 s)")
    ap.add_argument("--stop-timeout", type=float, default=150, help="kill a launch this long after SIGINT")
    ap.add_argument("--grace-s", type=float, default=15, help="...or at the deadline plus this, if earlier")
    ap.add_argument("--min-window-s", type=float, default=40, help="least steady state before a resume")
    ap.add_argument("--alone-steps", type=int, default=6)
    ap.add_argument("--alone-extra-s", type=float, default=30, help="8 GPUs: targets 1-4, after the rest")
    ap.add_argument("--alone-warmup", type=int, default=3, help="includes the compile of 2 shapes")
    ap.add_argument("--grad-accum-two", type=int, default=1, help="--grad-accum of the 1 + 1 runs")
    ap.add_argument("--sequences", type=int, default=600)
    ap.add_argument("--epochs", type=int, default=24)
    ap.add_argument("--no-shared-compile-cache", dest="shared_compile_cache", action="store_false")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--build", action="store_true", help=argparse.SUPPRESS)  # child: build the target
    ap.add_argument("--alone", nargs=3, metavar=("ROLE", "DEVICE", "TAG"), help=argparse.SUPPRESS)
    ap.add_argument("--alone-split", default="two", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.tiny:
        a.save_est_s, a.exit_s, a.startup_est_s, a.step_est_s, a.stop_timeout = 5, 5, 20, 1, 60
        a.alone_steps, a.alone_warmup, a.sequences, a.epochs = 4, 2, 200, 20
        if a.run_steps == 10_000:
            a.run_steps = 12
    os.makedirs(a.out, exist_ok=True)
    if a.alone:
        alone_child(a)
        return
    if a.build:
        build_target(os.path.join(a.work, "target"), a.tiny, "cpu" if a.tiny else "cuda:0")
        return
    parts = [p for p in a.parts.split(",") if p]
    bad = [p for p in parts if p not in PARTS]
    if bad:
        ap.error(f"unknown parts {bad}: choose from {','.join(PARTS)}")
    t_start = time.time()
    t_end = t_start + a.deadline_s if a.deadline_s else float("inf")
    res_path = os.path.join(a.out, "results.json")
    res: dict = {"parts": parts, "argv": sys.argv}

    def save() -> None:
        if "build" not in res and os.path.exists(os.path.join(a.work, "build.json")):
            with open(os.path.join(a.work, "build.json")) as f:
                res["build"] = json.load(f)
        update_projection(res, a)
        with open(res_path, "w") as f:
            json.dump(res, f, indent=1, default=str)
        write_reports(res, a)
        try:
            bundle(a)
        except OSError as e:
            log(f"bundle: {e}")

    for name, cmd in (
        ("nvidia_smi.txt", ["nvidia-smi"]),
        ("df.txt", ["df", "-h", "/dev/shm", a.work, "/"]),
        ("free.txt", ["free", "-g"]),
    ):  # the machine as the run found it (clocks, memory, file systems)
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
            with open(os.path.join(a.out, name), "w") as f:
                f.write(r.stdout + r.stderr)
        except (OSError, subprocess.SubprocessError):
            pass
    need = (0 if a.tiny else 56e9) + (2 * CKPT_BYTES if any(p in parts for p in ("two", "eight")) else 0)
    res["work"] = choose_work(a, need)
    env = environment(a)
    import torch
    import transformers

    fla = None
    try:
        import fla as _fla

        fla = getattr(_fla, "__version__", "?")
    except ImportError:
        pass
    res["env"] = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "fla": fla,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "shared_compile_cache": a.shared_compile_cache,
    }
    log(f"env {res['env']}; work {res['work']}")
    from bench_hybrid import text_config

    lengths = TINY_DOC_LENGTHS if a.tiny else DOC_LENGTHS
    bp.make_data(os.path.join(a.work, "data"), a.sequences, tuple(lengths), text_config(a.tiny).vocab_size)
    target = os.path.join(a.work, "target")

    def build() -> bool:
        t0 = time.time()
        b = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--build", "--out", a.out, "--work", a.work]
            + (["--tiny"] if a.tiny else []),
            env=env,
        )
        res["build_wall_s"] = time.time() - t0
        if b.returncode != 0 or not complete(target):
            res["build"] = {"error": f"exit {b.returncode}"}
            return False
        return True

    # else the first target alone builds it
    if not complete(target) and parts[0] not in ("alone", "alone8") and not build():
        save()
        log("the target could not be built: nothing else to run")
        return
    save()
    for part in parts:
        left = t_end - time.time()
        try:
            if part in ("alone", "alone8"):
                if left < 60:
                    res[part] = {"skipped": f"{left:.0f}s left"}
                    continue
                follows = [p for p in parts[parts.index(part) + 1 :] if p in ("two", "eight")]
                keep = 240 if follows and not a.tiny else 0  # a pipeline run and its resume need this much
                res[part] = run_alone(a, part, min(a.alone_s, max(60.0, left - keep)), env)
            elif part in ("two", "eight"):
                if not complete(target):  # the stages alone did not leave one: build it here
                    log("no complete target: building it")
                    res.pop("build", None)
                    if not build():
                        res[part] = {"skipped": "the target could not be built"}
                        continue
                    left = t_end - time.time()
                if left < a.startup_est_s + a.save_est_s + a.exit_s:
                    res[part] = {"skipped": f"{left:.0f}s left"}
                    continue
                resume = {"two": "resume", "eight": "resume8"}[part] in parts
                res[part] = run_part(a, part, env, t_end, resume)
            else:
                res[part] = resume_part(a, part, env, t_end, res.get(RESUME_OF[part]))
                shutil.rmtree(
                    os.path.join(a.work, f"run_{RESUME_OF[part]}", "checkpoints"), ignore_errors=True
                )
        except Exception as e:  # noqa: BLE001 - the next part still runs; the error is in the results
            res[part] = {"error": f"{type(e).__name__}: {e}"}
            traceback.print_exc()
        res.setdefault("wall_s", {})[part] = time.time() - t_start
        save()
    res["total_s"] = time.time() - t_start
    save()
    log(f"done in {res['total_s']:.0f}s; results {res_path}")
    with open(os.path.join(a.out, "projection.md")) as f:
        print(f.read())
    with open(os.path.join(a.out, "readme_rows.md")) as f:
        print(f.read())


if __name__ == "__main__":
    main()
