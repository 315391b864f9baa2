"""Real acceptance against the trainer's estimate, on a small real target trained here (issues 15, 35).

    PYTHONPATH=. python bench/bench_acceptance.py --out $OUT              # one H200 (~7 min)
    PYTHONPATH=. python bench/bench_acceptance.py --tiny --out /tmp/ba    # CPU smoke run (~1 min)
    PYTHONPATH=. python bench/bench_acceptance.py --out $OUT --parallel --drafter-steps 1500 \
        --blocks 8:2:dflash,8:2:dflash2,16:3                               # one H200, drafters at once
    PYTHONPATH=. python bench/bench_acceptance.py --tiny --target-arch qwen3_5 --parallel --out /tmp/bh

Seeded, offline, on text every machine has: the Python standard library's own ``*.py`` sources.
1. corpus: the stdlib's ``.py`` files in name order, as bytes (byte-level vocabulary: 256 bytes, then
   ``<eos>`` 256 and the drafter's mask token 257; vocab 260); a file goes to the held-out split when the
   SHA-256 of its relative path falls below 5%; 512-byte chunks;
2. target (bench/acceptance_target.py): ``--target-arch qwen3`` (default) a dense Qwen3-shaped byte LM
   (``--target-shape d512``: 8 layers, hidden 512, 8/4 heads x 64, intermediate 1536; ``h384``: 8 layers,
   hidden 384, 6/2 heads x 64, intermediate 1152), ``qwen3_5`` a hybrid Qwen3.5-family text model of the
   ``h384`` shape (2 x (3 Gated DeltaNet + 1 gated attention), 15.5M parameters), trained from scratch
   (AdamW 1e-3 cosine, bf16 autocast, 64 x 512 bytes a step; a hybrid through transformers' PyTorch Gated
   DeltaNet even where fla is installed); reports its next-byte accuracy on held-out chunks; saved as a
   transformers directory with a byte tokenizer. ``--save-target DIR`` also writes it as parts a device call
   returns, ``--target-from DIR`` takes such a target instead of training one (bench/target_transfer.py),
   ``--stop-after target`` ends there;
3. drafters: ``python -m trainer.pipeline`` on the training chunks (a hybrid target: its packed per-document
   capture), block 8 / 2 layers and block 16 / 3 layers (``--blocks``, bench/acceptance_specs.py: also a
   draft-layer pattern, ``16:5:dflash:SSSSF``), both roles on GPU 0, with ``--use-soft-labels`` (the seeds'
   setting; ``--hard-labels`` trains on
   the data bytes); the last step record's ``accept_len_est`` (running mean of the last 50 steps: the blocks
   walked as decoding would, by default the measuring runs of ``--est-anchors`` (the trainer's default; 0: the
   training anchors); with soft labels judged by the target's own argmax), ``accept_len_est_uniform``
   (the mean over uniformly sampled anchors: the estimate before the walk) and
   ``accept_len`` (the old formula); ``--parallel`` trains every drafter at once, then evaluates every one
   at once (the target is so small that one run leaves the GPU mostly idle; speed-ups are then measured
   under that shared load); ``--drafter-seed N`` trains them with another seed than ``--seed`` (which alone
   picks the chunks, prompts and target): a second training run to pair with the first;
4. real acceptance: ``python -m trainer.evaluate`` of each final export on 32 held-out prompts (the first
   128 bytes of held-out chunks) x 128 new tokens, greedy (a hybrid target's state rolled back by its default
   ``--rewind states``); acceptance, per position, speed-up over the target alone in the same run, greedy
   match, the wall time of the evaluation (its cost).
Results keys start with the target's tag (``qwen3_d512``, ``qwen3_h384``, ``qwen3_5_h384``).
``--blocks 8:2:dflash,8:2:dflash2`` trains DFlash 1 and DFlash 2 drafters alike (same data, steps, learning
rate, block size; ``--arch``) and evaluates both with the same loop; ``loss_curve`` holds each run's step losses
(DFlash 2's is the DFlash loss plus the selector's).
``--frozen-steps N``: then each drafter's estimate with its final weights frozen (``--init-drafter``, lr
1e-30) over N steps of the training chunks, of held-out chunks and of the text its real evaluation decoded
(the target's greedy output, saved by ``trainer.evaluate --save-outputs``): how much of the estimate's distance
from the real value comes from judging text the drafter trained on (several epochs at this bench's size), and
how much from judging the data's text instead of the target's own. With ``--train-text generated`` also over the
target's greedy continuation of held-out chunks' starts (``heldout_gen``): the training text's kind, never seen.
``--train-text generated``: the drafters train on the target's own greedy continuation of the training chunks'
first 128 bytes (the loss on what it wrote; as many bytes as the evaluation decodes, ``--gen-tokens``), as
recipes that regenerate responses with the target do; the step records' estimate then reads text of the kind
the evaluation decodes. Made by the recipe's own tools (bench/regen_text.py): ``python -m trainer.regenerate``
in-process (batch ``--regen-batch``; its tok/s lands in results.json) and ``python -m trainer.prepare``.
``--train-text compare``: every ``--blocks`` drafter twice, on the same prompts with the data's own next bytes
(``original``) and with the target's response (``regenerated``), then the two paired on the evaluation's
prompts (``report.paired_ratio``: regenerated over original, with its 95% interval).
``--regen-from FILE`` takes an earlier run's regenerated text (its ``work/regen/regenerated.jsonl``) instead of
regenerating it, where the same target wrote it for the same prompts (bench/regen_reuse.py).
``--blocks 8:2:dflash@fp8`` (issue 36, bench/acceptance_fp8.py): a drafter trained on the hidden states of the
target's FP8 version (written beside it as an FP8 checkpoint in Qwen's block-128 layout) beside its twin
``8:2:dflash`` on the bf16 one (same data, seed, steps), both evaluated against the bf16 target (``eval``) and
the FP8 one (``eval_fp8serve``: ``trainer.evaluate --target-dtype fp8 --no-baseline``: acceptance only), paired on the same prompts
(``..._fp8cap_vs_8_dflash_bf16serve`` / ``_fp8serve``, and each drafter's ``_fp8serve_vs_bf16serve``);
``--fp8-serve all`` serves every drafter by both; ``--fp8-scales row`` runs both the FP8 capture and the FP8
serving with one scale per weight row and per token (the rowwise FP8 matmul itself at h384, whose shapes the
block-scaled one does not take: block scales are emulated there). A GPU without block-scaled FP8 is refused at the start; the
CPU runs the FP8 checkpoint dequantised (FP8 weights, activations not quantised).
``--out`` gets ``results.json`` (rewritten after every phase) and the logs.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import json
import os
import subprocess
import sys
import sysconfig
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench import acceptance_fp8, acceptance_target, regen_reuse, regen_text, target_transfer  # noqa: E402
from bench.acceptance_flags import build_parser  # noqa: E402
from bench.acceptance_specs import (  # noqa: E402
    Spec,
    capture_pairs,
    comparisons,
    drafter_flags,
    key_of,
    parse_specs,
    served_fp8,
    tag_of,
)
from bench.acceptance_target import EOS, MASK, SEQ, VOCAB  # noqa: E402, F401  (the bench's vocabulary)
from trainer.evaluation.report import paired_ratio, pool  # noqa: E402

# the run's schedule at each size; the target's dimensions: acceptance_target.DIMS
FULL = dict(size="full", steps=1200, batch=64, chunks=24000, drafter_steps=400, budget=16384, prompts=32,
            new=128, device="cuda:0")  # fmt: skip
TINY = dict(size="tiny", steps=60, batch=8, chunks=400, drafter_steps=20, budget=2048, prompts=4, new=16,
            device="cpu")  # fmt: skip
# a CPU run with a target that is not degenerate (TINY's accepts everything): ~15 min on 2 cores
SMALL = dict(size="small", steps=400, batch=16, chunks=4000, drafter_steps=300, budget=4096, prompts=16, new=64,
             device="cpu")  # fmt: skip
PROMPT = 128


def corpus(limit_files: int | None):
    root = sysconfig.get_paths()["stdlib"]
    files = sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True))
    files = [f for f in files if "site-packages" not in f]
    if limit_files:
        files = files[:limit_files]
    train, held = bytearray(), bytearray()
    for f in files:
        rel = os.path.relpath(f, root)
        with open(f, "rb") as fh:
            data = fh.read() + b"\n"
        h = int.from_bytes(hashlib.sha256(rel.encode()).digest()[:8], "big")
        (held if h < 0.05 * 2**64 else train).extend(data)
    return bytes(train), bytes(held), len(files)


def corpus_id(train: bytes, held: bytes, nfiles: int) -> dict:
    """What names a corpus (results.json's ``corpus``): the corpus is the standard library of the Python that runs
    the bench, so another Python version (the GPU image's 3.12, a laptop's 3.11) gives other chunks and prompts."""
    return {"files": nfiles, "train_bytes": len(train), "heldout_bytes": len(held),
            "python": sys.version.split()[0],
            "sha256": hashlib.sha256(train + b"\0" + held).hexdigest()}  # fmt: skip


@functools.cache
def local_corpus() -> tuple[bytes, bytes, int]:
    """This machine's full corpus, read once a process."""
    return corpus(None)


@functools.cache
def local_corpus_id() -> dict:
    """``corpus_id`` of this machine's full corpus."""
    return corpus_id(*local_corpus())


def same_corpus(results: dict, where: str) -> None:
    """Refuse (SystemExit) to pair this machine's prompts with a run's results made on another corpus: the same
    ``--seed`` then names other prompts, and a per-prompt pairing would pair unrelated text."""
    theirs = results.get("corpus") or {}
    mine = local_corpus_id()
    if theirs.get("sha256") != mine["sha256"]:
        raise SystemExit(
            f"{where}: made on another corpus (Python {theirs.get('python')}'s standard library, "
            f"{theirs.get('files')} files) than this machine's (Python {mine['python']}, {mine['files']} "
            "files): its prompts are not these; pair it only where its Python runs"
        )


def prompt_record(prompts: list[list[int]]) -> list[str]:
    """The held-out prompts as results.json keeps them (``heldout_prompts``, hex): a CPU tool on another Python,
    whose corpus draws other prompts for the seed, reads them back (``prompts_of``)."""
    return [bytes(p).hex() for p in prompts]


def prompts_of(results: dict, n: int, where: str) -> list[list[int]]:
    """The first ``n`` held-out prompts a run decoded: the ones it recorded, or, for a run from before they were
    recorded, this machine's draw for its seed where its corpus is this machine's (else SystemExit)."""
    rec = results.get("heldout_prompts")
    if rec is None:
        same_corpus(results, where)
        return heldout_prompts(n, results.get("seed", 1))
    if not isinstance(rec, list) or len(rec) < n:
        raise SystemExit(f"{where}: its heldout_prompts are not a list of at least {n}")
    try:
        out = [list(bytes.fromhex(h)) for h in rec[:n] if isinstance(h, str) and len(h) <= 2 * SEQ]
    except ValueError:
        out = []
    if len(out) != n:
        raise SystemExit(f"{where}: its heldout_prompts are not hex strings of at most {SEQ} bytes")
    return out


def chunks(data: bytes, n: int, seed: int) -> list[list[int]]:
    import random

    starts = list(range(0, len(data) - SEQ, SEQ))
    random.Random(seed).shuffle(starts)
    return [list(data[s : s + SEQ]) for s in starts[:n]]


def heldout_chunks(held: bytes, prompts: int, seed: int) -> list[list[int]]:
    """The held-out chunks whose heads are the evaluation's prompts for ``--seed`` (four a prompt, in order)."""
    return chunks(held, 4 * prompts, seed + 2)


def heldout_prompts(n: int, seed: int, held: bytes | None = None) -> list[list[int]]:
    """The first ``n`` evaluation prompts of ``--seed`` (of ``held``, by default this machine's full corpus's
    held-out bytes): their first ``PROMPT`` bytes."""
    if held is None:
        held = local_corpus()[1]
    return [c[:PROMPT] for c in heldout_chunks(held, n, seed)[:n]]


def write_jsonl(path: str, seqs: list[list[int]], masks: list[list[int]] | None = None) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        for i, s in enumerate(seqs):
            row = {"input_ids": s} if masks is None else {"input_ids": s, "loss_mask": masks[i]}
            f.write(json.dumps(row, separators=(",", ":")) + "\n")


MARKER = ".bench_acceptance"


def fresh_work(work: str) -> None:
    """Start from an empty work directory: an earlier run's outputs there (a warm machine's) would be resumed
    or reused (a regeneration by another target, a run directory's compile cache). Only a directory this bench
    made (its marker file) is emptied; another non-empty one is refused."""
    import shutil

    if os.path.isdir(work) and os.listdir(work):
        if not os.path.isfile(os.path.join(work, MARKER)):
            raise SystemExit(f"--work {work}: not empty and not made by this bench; give an empty directory")
        for name in os.listdir(work):
            path = os.path.join(work, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.remove(path)
    os.makedirs(work, exist_ok=True)
    open(os.path.join(work, MARKER), "w").close()


def env() -> dict:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, e.get("PYTHONPATH")) if p)
    return e


def fp8_flags(cfg: dict, dtype: str | None) -> list[str]:
    """The trainer's / trainer.evaluate's flags for a drafter's capture or serving dtype, at the run's scaling."""
    return acceptance_fp8.dtype_flags(dtype, cfg.get("fp8_scales", "block"))


def _launch(cfg, work, out, log_name, run, data, spec: Spec, soft, schedule, anchor_run) -> tuple:
    """``trainer.pipeline`` for one drafter of this bench on ``data`` into ``run``: the bench's shared flags plus
    ``schedule`` (steps, epochs, learning rate, seed, ...); ``finish_drafter`` waits for it and reads it."""
    dev = "0" if cfg["device"].startswith("cuda") else "cpu"
    argv = [sys.executable, "-m", "trainer.pipeline", "--target-model", acceptance_fp8.target_dir(work, spec.capture),
            "--data-dir", os.path.join(work, data), "--output-dir", run, "--target-gpus", dev,
            "--drafter-gpus", dev, "--block-size", str(spec.block), "--num-draft-layers", str(spec.layers),
            "--max-anchors", "256", "--token-budget", str(cfg["budget"]), "--max-seq-len", str(SEQ),
            "--gamma", "7", "--mask-token-id", str(MASK), "--log-every", "50", "--resume", "none",
            "--anchor-run", str(anchor_run), "--est-anchors", str(cfg["est_anchors"]),
            "--est-holdout", str(cfg["est_holdout"]), *schedule,
            *drafter_flags(spec), *fp8_flags(cfg, spec.capture)]  # fmt: skip
    if soft:
        argv += ["--use-soft-labels"]
    log = open(os.path.join(out, log_name), "w")  # noqa: SIM115 (closed by finish_drafter)
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env(), cwd=ROOT)
    return proc, log, run, time.monotonic()


def start_drafter(cfg, work, out, spec: Spec, seed, soft=True):
    """Train one drafter of ``spec``: on ``data_<text>`` when its text is given, else on ``data``
    (``finish_drafter`` waits for it and reads its records)."""
    tag = tag_of(spec)
    schedule = ["--max-steps", str(cfg["drafter_steps"]), "--epochs", "50", "--lr", "1e-3", "--warmup-ratio", "0.04",
                "--seed", str(seed)]  # fmt: skip
    data = f"data_{spec.text}" if spec.text else "data"
    run = os.path.join(work, f"run_{tag}")
    return _launch(cfg, work, out, f"train_{tag}.log", run, data, spec, soft, schedule, cfg["anchor_run"])


def finish_drafter(started) -> dict:
    proc, log, run, t0 = started
    rc = proc.wait()
    log.close()
    with open(os.path.join(run, "metrics.jsonl")) as f:
        recs = [json.loads(x) for x in f if x.strip()]
    # this run's records: a fresh start in a run directory used before (a warm machine's work dir) appends
    # after the earlier runs' records, from its own "started" event on (docs/run-directory.md)
    starts = [i for i, r in enumerate(recs) if r.get("kind") == "event" and r.get("name") == "started"]
    recs = recs[starts[-1] :] if starts else recs
    st = [r for r in recs if r["kind"] == "step"]
    return {"rc": rc, "seconds": time.monotonic() - t0, "steps": len(st), "run_dir": run,
            "accept_len_est": st[-1].get("accept_len_est") if st else None,
            "accept_len_est_step_last": st[-1].get("accept_len_est_step") if st else None,
            "accept_len_est_vs": st[-1].get("accept_len_est_vs", "data") if st else None,
            "accept_len_est_anchors": st[-1].get("accept_len_est_anchors", "training") if st else None,
            "accept_len_est_uniform": st[-1].get("accept_len_est_uniform") if st else None,
            "accept_len_old": st[-1].get("accept_len") if st else None,
            "loss": st[-1].get("loss") if st else None,
            "loss_curve": [[r["step"], r.get("loss")] for r in st]}  # fmt: skip


def start_frozen(cfg, work, out, spec: Spec, seed, data, steps, soft=True):
    """The estimate of one trained drafter with its weights frozen, on ``data`` (``data``: the training chunks
    it saw; ``heldout_data``: held-out chunks it never saw; ``generated``: the prompts and the text its real
    evaluation decoded, the target's own, every generated position a candidate anchor):
    ``trainer.pipeline --init-drafter`` its final checkpoint's training-dtype weights, ``--lr 1e-30`` (no fp32
    weight moves: far below their resolution), ``steps`` steps (epochs repeat a small set, anchors sampled
    anew), the same flags. Separates "seen in training" and "the data's text" from what real decoding sees."""
    tag = tag_of(spec)
    if data == "generated":
        data = f"generated_{tag}"
    ck = sorted(glob.glob(os.path.join(work, f"run_{tag}", "checkpoints", "step_*")))[-1]
    name = f"frozen_{tag}_{data.split('_b')[0]}"
    schedule = ["--max-steps", str(steps), "--epochs", "200", "--lr", "1e-30", "--warmup-ratio", "0",
                "--seed", str(seed + 7), "--init-drafter", os.path.join(ck, "drafter")]  # fmt: skip
    run = os.path.join(work, name)
    return _launch(cfg, work, out, f"{name}.log", run, data, spec, soft, schedule, cfg["frozen_anchor_run"])


def shard_prompts(work: str, prompts: str, n: int, shards: int) -> list[tuple[str, int]]:
    """The first ``n`` prompts of a prompt set cut into ``shards`` consecutive files (``<set>/shardI/``), so that
    the shards' evaluations together decode exactly the prompts one evaluation of ``n`` would."""
    with open(os.path.join(work, prompts, "prompts.jsonl")) as f:
        lines = [x for x in f if x.strip()][:n]
    if len(lines) < n:
        raise SystemExit(f"{prompts}: {len(lines)} prompts, {n} asked for")
    dirs, cut = [], [round(i * n / shards) for i in range(shards + 1)]
    for i in range(shards):
        d = os.path.join(work, prompts, f"shard{i}")
        os.makedirs(d, exist_ok=True)
        path, text = os.path.join(d, "prompts.jsonl"), "".join(lines[cut[i] : cut[i + 1]])
        write_once(path, text)
        dirs.append((os.path.join(prompts, f"shard{i}"), cut[i + 1] - cut[i]))
    return dirs


def write_once(path: str, text: str) -> None:
    """Write ``text`` unless the file holds it already: each evaluation cuts the same shards, and one started
    before must not find its prompt file truncated."""
    if os.path.isfile(path):
        with open(path) as f:
            if f.read() == text:
                return
    with open(path, "w") as f:
        f.write(text)


def start_eval(cfg, work, out, spec: Spec, prompts="heldout", prompt_len=PROMPT, serve=None, label=""):
    """Launch ``trainer.evaluate`` of one drafter's final export on a prompt set (``heldout``: held-out files;
    ``train``: chunks of the training files) cut to ``prompt_len`` bytes, as ``cfg["eval_shards"]`` processes
    side by side on consecutive slices of the prompts, against the bf16 target or (``serve="fp8"``) its FP8
    version (bench/acceptance_fp8.py; acceptance only, ``--no-baseline``); ``finish_eval`` waits and pools them.
    ``label`` names an evaluation other than the main one (its log; it saves no outputs)."""
    tag = tag_of(spec)
    name = "" if (prompts, prompt_len) == ("heldout", PROMPT) else f"_{prompts}{prompt_len}"
    name += ("_fp8serve" if serve == "fp8" else "") + (f"_{label}" if label else "")
    shards = cfg.get("eval_shards", 1)
    sets = (
        [(prompts, cfg["prompts"])] if shards == 1 else shard_prompts(work, prompts, cfg["prompts"], shards)
    )
    procs = []
    for i, (pset, n) in enumerate(sets):
        argv = [sys.executable, "-m", "trainer.evaluate", "--target-model", acceptance_fp8.target_dir(work, serve),
                "--drafter", os.path.join(work, f"run_{tag}"), "--prompts", os.path.join(work, pset),
                "--num-prompts", str(n), "--max-new-tokens", str(cfg["new"]), "--prompt-len",
                str(prompt_len), "--device", cfg["device"], "--ignore-eos", "--json",
                *fp8_flags(cfg, serve)]  # fmt: skip
        if serve == "fp8" or cfg.get("acceptance_only", False):
            # acceptance only (a third of the time): the bf16 evaluations (unless --acceptance-only) time the loop
            # and check it
            argv += ["--no-baseline"]
        elif not name:
            # the main evaluation keeps the text it decoded: the target's own (--frozen-steps scores on it)
            argv += ["--save-outputs", os.path.join(work, f"generated_{tag}", f"out{i}.jsonl")]
        procs.append(_spawn_shard(argv, os.path.join(out, f"eval_{tag}{name}.shard{i}.log")))
    return procs, os.path.join(out, f"eval_{tag}{name}.log"), time.monotonic()


def _spawn_shard(argv: list[str], log: str):
    """One evaluation process; its progress (stderr) goes to ``log`` as it runs, so a run cut by a time limit
    still shows how far each shard got. (process, log path)."""
    with open(log, "w") as err:  # the child keeps its own descriptor
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True, env=env(), cwd=ROOT)
    return p, log


def _read_log(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def finish_eval(started) -> dict:
    """Waits for ``start_eval``'s shards; their logs joined into one (the shard logs removed); the report, pooled
    over the shards, or the first failure."""
    procs, log_path, t0 = started
    reports, failed = [], None
    with open(log_path, "w") as f:
        for i, (p, shard_log) in enumerate(procs):
            stdout, _ = p.communicate()
            stderr = _read_log(shard_log)
            os.remove(shard_log)
            f.write(f"--- shard {i}\n{stderr}" if len(procs) > 1 else stderr)
            if p.returncode != 0 or not stdout.strip():
                failed = failed or {"rc": p.returncode, "shard": i, "stderr": stderr[-2000:]}
            else:
                reports.append(json.loads(stdout.strip().splitlines()[-1]))
    if failed:
        return failed
    rep = reports[0] if len(reports) == 1 else pool(reports)
    rep["wall_seconds_with_load"] = time.monotonic() - t0
    return rep


def drafter_seed(a) -> int:
    """The drafters' training seed: ``--drafter-seed``, else ``--seed`` (which alone picks the corpus's chunks,
    the prompts and the target)."""
    return a.seed if a.drafter_seed is None else a.drafter_seed


def spec_seed(spec: Spec, run_seed: int) -> int:
    """One drafter's training seed: its spec's ``@sN``, else the run's (``drafter_seed``)."""
    return run_seed if spec.seed is None else spec.seed


def settle(ap, a) -> tuple[dict, list[tuple[str, int]], list[Spec]]:
    """The run's configuration from the flags (``ap.error`` on bad input): (cfg, extra prompt sets, specs)."""
    cfg = dict(TINY if a.tiny else SMALL if a.small else FULL)
    try:
        cfg["target"] = acceptance_target.target_dims(cfg["size"], a.target_arch, a.target_shape)
        specs = parse_specs(a.blocks, a.train_text)
    except ValueError as e:
        ap.error(str(e))
    cfg["target_tag"] = acceptance_target.target_tag(cfg["target"])
    cfg["anchor_run"], cfg["frozen_anchor_run"] = a.anchor_run, a.frozen_anchor_run
    cfg["fp8_scales"] = a.fp8_scales
    cfg["drafter_seed"] = drafter_seed(a)
    if a.regen_from and a.train_text == "data":
        ap.error("--regen-from takes the target's responses: it needs --train-text generated or compare")
    cfg["est_anchors"], cfg["est_holdout"] = a.est_anchors, a.est_holdout
    for key, flag in (
        ("drafter_steps", a.drafter_steps),
        ("prompts", a.eval_prompts),
        ("steps", a.target_steps),
    ):
        if flag is not None and flag < 1:
            ap.error(f"a step or prompt count must be >= 1, got {flag}")
        cfg[key] = flag or cfg[key]
    if not 1 <= a.eval_shards <= cfg["prompts"]:
        ap.error(f"--eval-shards must be 1 .. the evaluation's prompts ({cfg['prompts']})")
    if a.target_from and a.target_steps:
        ap.error("--target-steps trains a target; --target-from takes a trained one")
    cfg["eval_shards"], cfg["acceptance_only"] = a.eval_shards, a.acceptance_only
    speed = a.speed_prompts if a.speed_prompts is not None else (8 if cfg["device"].startswith("cuda") else 0)
    if not 0 <= speed <= cfg["prompts"]:
        ap.error(f"--speed-prompts must be 0 .. the evaluation's prompts ({cfg['prompts']})")
    cfg["speed_prompts"] = speed
    prompt_sets = [(x.split(":")[0], int(x.split(":")[1])) for x in a.prompt_sets.split(",") if x]
    return cfg, prompt_sets, specs


def prepare_corpus(a, cfg, work, res) -> tuple[bytes, bytes, int]:
    """The corpus's training and held-out bytes, and the files the phases read (training chunks, prompts,
    the frozen passes' held-out chunks); (train, held, the frozen passes' chunk count)."""
    train, held, nfiles = corpus(200 if a.tiny else None)
    res["corpus"] = corpus_id(train, held, nfiles)
    write_jsonl(os.path.join(work, "data", "train.jsonl"), chunks(train, cfg["chunks"], a.seed))
    write_jsonl(os.path.join(work, "heldout", "prompts.jsonl"), heldout_chunks(held, cfg["prompts"], a.seed))
    res["heldout_prompts"] = prompt_record(heldout_prompts(cfg["prompts"], a.seed, held))
    write_jsonl(os.path.join(work, "train", "prompts.jsonl"), chunks(train, 4 * cfg["prompts"], a.seed + 3))
    n_frozen = a.frozen_steps * cfg["budget"] // SEQ + 64  # chunks for N frozen steps, with room to spare
    if a.frozen_steps:  # held-out chunks in the training format, for the frozen estimate
        write_jsonl(os.path.join(work, "heldout_data", "heldout.jsonl"), chunks(held, n_frozen, a.seed + 4))
    return train, held, n_frozen


def fetched_target(a, cfg, dest: str, held_chunks, corpus_facts: dict) -> dict:
    """``--target-from``: the earlier run's target into ``dest``, checked against this run (arch, shape,
    size, corpus), and scored again on the held-out chunks as loaded here (``..._as_loaded``)."""
    try:
        facts = target_transfer.fetch_target(a.target_from, dest)
    except target_transfer.TransferError as e:
        raise SystemExit(str(e)) from None
    t = facts["target"]
    want = {"arch": cfg["target"]["arch"], "shape": cfg["target"]["shape"], "size": cfg["size"],
            "corpus": corpus_facts["sha256"]}  # fmt: skip
    have = {"arch": t.get("arch"), "shape": t.get("shape"), "size": facts.get("size"),
            "corpus": (facts.get("corpus") or {}).get("sha256")}  # fmt: skip
    if want != have:
        diff = {k: (have[k], want[k]) for k in want if want[k] != have[k]}
        raise SystemExit(f"--target-from {a.target_from}: not this run's target (saved, wanted): {diff}")
    t = {**t, "from": a.target_from, "trained_seed": facts.get("seed")}
    t["heldout_next_byte_accuracy_as_loaded"] = acceptance_target.saved_accuracy(
        dest, held_chunks, cfg["device"]
    )
    return t


def make_target(a, cfg, work, train: bytes, held: bytes, res: dict) -> None:
    """The target in ``work/target``: trained here (its facts beside it in ``bench_target.json``) or taken
    from ``--target-from``; ``--save-target`` then packs it into parts."""
    dest = os.path.join(work, "target")
    held_chunks = chunks(held, 64, a.seed + 1)
    if a.target_from:
        res["target"] = fetched_target(a, cfg, dest, held_chunks, res["corpus"])
    else:
        res["target"] = acceptance_target.train_target(cfg["target"], cfg, train, held_chunks, dest, a.seed)
        facts = {"target": res["target"], "corpus": res["corpus"], "size": cfg["size"], "seed": a.seed}
        with open(os.path.join(dest, target_transfer.FACTS), "w", encoding="utf-8") as f:
            json.dump(facts, f, indent=1)
    if a.save_target:
        parts = target_transfer.pack(dest, a.save_target)
        res["target"]["saved_parts"] = {"dir": a.save_target, "files": [os.path.basename(p) for p in parts],
                                        "bytes": sum(os.path.getsize(p) for p in parts)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    cfg, prompt_sets, specs = settle(ap, a)
    a.fp8_served = served_fp8(specs, a.fp8_serve == "all")  # the drafters also served by the FP8 target
    if a.fp8_served:
        cfg["fp8"] = acceptance_fp8.check_device(cfg["device"])  # refused here, before the target trains
    work = a.work or ("/tmp/dflash_accept" if a.tiny or a.small else "/dev/shm/dflash_accept")
    fresh_work(work)
    os.makedirs(a.out, exist_ok=True)
    res: dict = {"config": cfg, "seed": a.seed, "command": sys.argv if argv is None else argv}

    def save() -> None:
        with open(os.path.join(a.out, "results.json"), "w") as f:
            json.dump(res, f, indent=1)

    t0 = time.monotonic()
    train, held, n_frozen = prepare_corpus(a, cfg, work, res)
    make_target(a, cfg, work, train, held, res)
    res["phase_seconds"] = {"corpus_and_target": time.monotonic() - t0}
    save()
    if a.stop_after == "target":
        res["total_seconds"] = time.monotonic() - t0
        save()
        return 0
    if a.fp8_served:
        res["fp8_target"] = acceptance_fp8.write_fp8_target(
            os.path.join(work, "target"), acceptance_fp8.target_dir(work, "fp8"), a.fp8_scales
        )
        print(f"FP8 target: {json.dumps(res['fp8_target'])}", flush=True)
    cfg["train_text"] = a.train_text
    training_text(a, cfg, work, train, held, n_frozen, res)
    res["phase_seconds"]["training_text"] = time.monotonic() - t0
    save()
    # --parallel: every drafter trains at once (this target is so small that one run leaves the GPU mostly
    # idle), then every evaluation runs at once; their speed-ups are then measured under that shared load
    for group in [specs] if a.parallel else [[x] for x in specs]:
        run_group(a, cfg, work, group, prompt_sets, res, save)
        res["phase_seconds"]["drafters" if a.parallel else key_of(group[0], cfg["target_tag"])] = (
            time.monotonic() - t0
        )
    res["total_seconds"] = time.monotonic() - t0
    save()
    return 0


def training_text(a, cfg, work, train: bytes, held: bytes, n_frozen: int, res: dict) -> None:
    """The drafters' data for ``--train-text generated`` / ``compare``: the chunks' starts as prompts, the
    target's responses by ``trainer.regenerate`` and (compare) the data's own next bytes, each through
    ``trainer.prepare`` (bench/regen_text.py); ``data`` keeps the raw chunks."""
    if a.train_text == "data":
        return
    target, log = os.path.join(work, "target"), os.path.join(a.out, "regenerate.log")
    cfg["regen_batch"] = a.regen_batch or (1024 if cfg["device"] != "cpu" else 64)
    cfg["regen_new"] = a.gen_tokens or cfg["new"]
    pairs, skipped = regen_text.text_pairs(
        chunks(train, a.gen_chunks or cfg["chunks"] // 2, a.seed), PROMPT, cfg["regen_new"]
    )
    original = None
    if a.train_text == "compare":  # tokenized while the target writes its responses
        raw = regen_text.write_pairs(os.path.join(work, "regen", "original.jsonl"), pairs)
        original = regen_text.prepare(target, raw, os.path.join(work, "data_original"), log, env(), ROOT)
    summary = regenerated(a, cfg, target, pairs, os.path.join(work, "regen"), log)
    summary["not_utf8_left_out"] = skipped
    res["generated_train_text"] = summary
    how = "taken from an earlier run (--regen-from)" if "reused" in summary else "regenerated by the target"
    print(f"training text {how}: {json.dumps(summary)}", flush=True)
    name = "data_regenerated" if a.train_text == "compare" else "data"
    regen_text.prepare(target, summary["raw"], os.path.join(work, name), log, env(), ROOT)()
    if original is not None:
        original()
    elif a.frozen_steps:  # the same kind of text from held-out chunks' starts, for the frozen estimate
        pairs, _ = regen_text.text_pairs(chunks(held, n_frozen, a.seed + 4), PROMPT, cfg["regen_new"])
        rep = regen_text.regenerate(target, pairs, os.path.join(work, "regen_held"), cfg, log, env(), ROOT)
        res["generated_heldout_text"] = rep
        regen_text.prepare(target, rep["raw"], os.path.join(work, "heldout_gen"), log, env(), ROOT)()


def regenerated(a, cfg, target: str, pairs: list[dict], out_dir: str, log: str) -> dict:
    """The target's responses: regenerated now, or (``--regen-from``) an earlier run's, if they fit this run."""
    if not a.regen_from:
        return regen_text.regenerate(target, pairs, out_dir, cfg, log, env(), ROOT)
    try:
        return regen_reuse.reuse(a.regen_from, pairs, out_dir, target, cfg["regen_new"])
    except (OSError, ValueError) as e:
        raise SystemExit(f"--regen-from: {e}") from None


def record_eval(res: dict, cfg: dict, spec: Spec, d: dict, e: dict) -> None:
    real, est = e.get("mean_accept_len"), d.get("accept_len_est")
    est_uniform = d.get("accept_len_est_uniform")
    res[key_of(spec, cfg["target_tag"])] = {
        "target": cfg["target_tag"], "layers": spec.layers, "arch": spec.arch or "dflash",
        "pattern": spec.pattern, "sliding_window": spec.window, "text": spec.text or "data",
        "capture": spec.capture or "bf16", "train": d, "eval": e,
        "estimate_over_real": est / real if real and est else None,
        "estimate_uniform_over_real": est_uniform / real if real and est_uniform else None}  # fmt: skip
    print(json.dumps({"drafter": key_of(spec, cfg["target_tag"]), "real": real,
                      "real_se": e.get("mean_accept_len_se"), "est": est, "est_vs": d.get("accept_len_est_vs"),
                      "est_uniform": est_uniform, "old": d.get("accept_len_old"), "speedup": e.get("speedup"),
                      "greedy_match": e.get("greedy_match"), "eval_s": e.get("seconds")}), flush=True)  # fmt: skip


def paired_comparisons(res: dict, cfg: dict, group: list[Spec], save) -> None:
    """Prompt by prompt (``acceptance_specs.comparisons``): DFlash 2 against DFlash 1, a layer pattern against
    all-full layers, regenerated-text drafters against original-text ones."""
    for one_key, two_key, what in comparisons(group, cfg["target_tag"]):
        one, two = res.get(one_key, {}).get("eval", {}), res.get(two_key, {}).get("eval", {})
        if "prompt_steps" in one and "prompt_steps" in two:
            short = one_key.removeprefix(f"{cfg['target_tag']}_").removeprefix("block")
            res[f"{two_key}_vs_{short}"] = cmp = paired_ratio(one, two)
            save()
            print(json.dumps({"drafters": [one_key, two_key], what: cmp}), flush=True)


def fp8_comparisons(a, res: dict, cfg: dict, save) -> None:
    """FP8-captured over bf16-captured drafters under each serving dtype, and FP8 serving over bf16 serving
    (bench/acceptance_fp8.py), once both sides are evaluated (after the group that evaluates the last)."""
    tag = cfg["target_tag"]
    pairs, keys = capture_pairs(a.fp8_served, tag), [key_of(x, tag) for x in a.fp8_served]
    for k, cmp in acceptance_fp8.capture_comparisons(res, tag, pairs, keys).items():
        if k not in res:
            res[k] = cmp
            save()
            print(json.dumps({k: cmp}), flush=True)


def run_group(a, cfg, work, group: list[Spec], prompt_sets, res: dict, save) -> None:
    """Train the group's drafters side by side, then evaluate them side by side (and the extra prompt sets,
    the frozen passes)."""
    seed, soft = drafter_seed(a), not a.hard_labels
    started = [(x, start_drafter(cfg, work, a.out, x, spec_seed(x, seed), soft=soft)) for x in group]
    trained = {x: {**finish_drafter(st), "seed": spec_seed(x, seed)} for x, st in started}
    for x, d in trained.items():  # kept now: a call whose time runs out in the evaluations still has them
        res.setdefault(key_of(x, cfg["target_tag"]), {})["train"] = d
    save()
    evals = [(x, start_eval(cfg, work, a.out, x)) for x in group]
    fp8 = [(x, start_eval(cfg, work, a.out, x, serve="fp8")) for x in group if x in a.fp8_served]
    extra = [((x, ps), start_eval(cfg, work, a.out, x, *ps)) for x in group for ps in prompt_sets]
    for x, st in evals:
        record_eval(res, cfg, x, trained[x], finish_eval(st))
        save()
    for x, st in fp8:  # the same prompts against the FP8 target
        e, key = finish_eval(st), key_of(x, cfg["target_tag"])
        res[key]["eval_fp8serve"] = e
        save()
        print(json.dumps({"drafter": key, "served": "fp8", "real": e.get("mean_accept_len"),
                          "real_se": e.get("mean_accept_len_se"), "eval_s": e.get("seconds")}), flush=True)  # fmt: skip
    paired_comparisons(res, cfg, group, save)
    fp8_comparisons(a, res, cfg, save)
    for (x, (ps, plen)), st in extra:  # the same drafters on other prompt sets
        e, key = finish_eval(st), key_of(x, cfg["target_tag"])
        res[key][f"eval_{ps}{plen}"] = e
        est, real = res[key]["train"].get("accept_len_est"), e.get("mean_accept_len")
        save()
        print(json.dumps({"drafter": key, "prompts": ps, "prompt_len": plen, "real": real,
                          "est_over_real": est / real if est and real else None}), flush=True)  # fmt: skip
    speed_alone(cfg, work, a.out, group, res, save)
    frozen_passes(a, cfg, work, group, res, save)


def speed_alone(cfg, work, out, group: list[Spec], res: dict, save) -> None:
    """``--speed-prompts``: each drafter of the group, one after another, on the first N held-out prompts in one
    process with nothing beside it: target-only and speculative tok/s on a quiet device (the main evaluation's
    shards share it), under ``speed_alone``."""
    if not cfg.get("speed_prompts"):
        return
    quiet = {**cfg, "eval_shards": 1, "prompts": cfg["speed_prompts"], "acceptance_only": False}
    for x in group:
        e, key = finish_eval(start_eval(quiet, work, out, x, label="alone")), key_of(x, cfg["target_tag"])
        keep = ("target_tok_s", "spec_tok_s", "speedup", "mean_accept_len", "prompts", "new_tokens", "engine",
                "cuda_graphs", "greedy_mismatches", "greedy_mismatches_near_tie", "seconds", "rc", "stderr")  # fmt: skip
        res[key]["speed_alone"] = {k: e[k] for k in keep if k in e}
        save()
        print(json.dumps({"drafter": key, "alone": res[key]["speed_alone"]}), flush=True)


def frozen_passes(a, cfg, work, group: list[Spec], res: dict, save) -> None:
    datas = ("data", "heldout_data", "generated") + (("heldout_gen",) if a.train_text == "generated" else ())
    seed, soft = drafter_seed(a), not a.hard_labels
    frozen = [
        ((x, data), start_frozen(cfg, work, a.out, x, spec_seed(x, seed), data, a.frozen_steps, soft=soft))
        for x in (group if a.frozen_steps else [])
        for data in datas
    ]
    for (x, data), st in frozen:
        d = finish_drafter(st)
        d.pop("loss_curve", None)
        key = key_of(x, cfg["target_tag"])
        res[key][f"frozen_{data}"] = d
        real = res[key]["eval"].get("mean_accept_len")
        save()
        print(json.dumps({"drafter": key, "frozen_on": data, "est": d.get("accept_len_est"),
                          "est_over_real": d["accept_len_est"] / real if d.get("accept_len_est") and real else None,
                          "steps": d.get("steps"), "rc": d.get("rc")}), flush=True)  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
