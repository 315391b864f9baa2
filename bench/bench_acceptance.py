"""Real acceptance against the trainer's estimate, on a small real target trained here (issue 15).

    PYTHONPATH=. python bench/bench_acceptance.py --out $OUT              # one H200 (~7 min)
    PYTHONPATH=. python bench/bench_acceptance.py --tiny --out /tmp/ba    # CPU smoke run (~1 min)
    PYTHONPATH=. python bench/bench_acceptance.py --out $OUT --parallel --drafter-steps 1500 \
        --blocks 8:2:dflash,8:2:dflash2,16:3                               # one H200, drafters at once

Seeded, offline, on text every machine has: the Python standard library's own ``*.py`` sources.
1. corpus: the stdlib's ``.py`` files in name order, as bytes (byte-level vocabulary: 256 bytes, then
   ``<eos>`` 256 and the drafter's mask token 257; vocab 260); a file goes to the held-out split when the
   SHA-256 of its relative path falls below 5%; 512-byte chunks;
2. target: a Qwen3-shaped byte LM (8 layers, hidden 512, 8/4 heads x 64, intermediate 1536) trained from
   scratch (AdamW 1e-3 cosine, bf16 autocast, 64 x 512 bytes a step); reports its next-byte accuracy on
   held-out chunks; saved as a transformers directory;
3. drafters: ``python -m trainer.pipeline`` on the training chunks, block 8 / 2 layers and block 16 / 3
   layers, both roles on GPU 0, with ``--use-soft-labels`` (the seeds' setting; ``--hard-labels`` trains on
   the data bytes); the last step record's ``accept_len_est`` (running mean of the last 50 steps: the blocks
   walked as decoding would, by default the measuring runs of ``--est-anchors`` (the trainer's default; 0: the
   training anchors); with soft labels judged by the target's own argmax), ``accept_len_est_uniform``
   (the mean over uniformly sampled anchors: the estimate before the walk) and
   ``accept_len`` (the old formula); ``--parallel`` trains every drafter at once, then evaluates every one
   at once (the target is so small that one run leaves the GPU mostly idle; speed-ups are then measured
   under that shared load);
4. real acceptance: ``python -m trainer.evaluate`` of each final export on 32 held-out prompts (the first
   128 bytes of held-out chunks) x 128 new tokens, greedy; acceptance, per position, speed-up over the target
   alone in the same run, greedy match, the wall time of the evaluation (its cost).
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
``--out`` gets ``results.json`` (rewritten after every phase) and the logs.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import math
import os
import subprocess
import sys
import sysconfig
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench import regen_text  # noqa: E402
from trainer.evaluation.report import paired_ratio, pool  # noqa: E402
from trainer.run.flags import build_parser  # noqa: E402  (the trainer's own defaults)

EOS, MASK, VOCAB = 256, 257, 260
FULL = dict(hidden=512, layers=8, heads=8, kv=4, head_dim=64, inter=1536, steps=1200, batch=64,
            chunks=24000, drafter_steps=400, budget=16384, prompts=32, new=128, device="cuda:0")  # fmt: skip
TINY = dict(hidden=64, layers=4, heads=4, kv=2, head_dim=16, inter=128, steps=60, batch=8,
            chunks=400, drafter_steps=20, budget=2048, prompts=4, new=16, device="cpu")  # fmt: skip
# a CPU run with a target that is not degenerate (TINY's accepts everything): ~15 min on 2 cores
SMALL = dict(hidden=128, layers=4, heads=4, kv=2, head_dim=32, inter=384, steps=400, batch=16,
             chunks=4000, drafter_steps=300, budget=4096, prompts=16, new=64, device="cpu")  # fmt: skip
SEQ, PROMPT = 512, 128
# --blocks arch names that are a trainer architecture plus flags (the result key keeps the name);
# dflash2ug: the selector's loss also through the unary logits (speculators' objective)
VARIANTS = {"dflash2ug": ("dflash2", ["--selector-unary-grad"])}


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


def chunks(data: bytes, n: int, seed: int) -> list[list[int]]:
    import random

    starts = list(range(0, len(data) - SEQ, SEQ))
    random.Random(seed).shuffle(starts)
    return [list(data[s : s + SEQ]) for s in starts[:n]]


def train_target(cfg, train: bytes, held: bytes, out_dir: str, seed: int) -> dict:
    import numpy as np
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    dev = cfg["device"]
    qc = Qwen3Config(vocab_size=VOCAB, hidden_size=cfg["hidden"], intermediate_size=cfg["inter"],
                     num_hidden_layers=cfg["layers"], num_attention_heads=cfg["heads"],
                     num_key_value_heads=cfg["kv"], head_dim=cfg["head_dim"], max_position_embeddings=4096,
                     rope_theta=10000.0, tie_word_embeddings=False, eos_token_id=EOS, bos_token_id=None,
                     pad_token_id=None)  # fmt: skip
    qc._attn_implementation = "sdpa"
    model = Qwen3ForCausalLM(qc).to(dev)
    data = torch.from_numpy(np.frombuffer(train, dtype=np.uint8).astype(np.int64))
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, betas=(0.9, 0.95))
    steps, B = cfg["steps"], cfg["batch"]
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if dev.startswith("cuda") else None
    t0 = time.monotonic()
    losses = []
    for step in range(steps):
        lr = 1e-3 * min(1.0, (step + 1) / 50) * 0.5 * (1 + math.cos(math.pi * step / steps))
        for gr in opt.param_groups:
            gr["lr"] = lr
        idx = torch.randint(0, len(data) - SEQ - 1, (B,), generator=g)
        x = data[idx.unsqueeze(1) + torch.arange(SEQ)].to(dev)
        if amp is not None:
            with amp:
                loss = model(input_ids=x, labels=x).loss
        else:
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 100 == 0 or step == steps - 1:
            losses.append((step, float(loss.detach())))
            print(
                f"target step {step}/{steps} loss {loss.item():.3f} ({time.monotonic() - t0:.0f}s)",
                flush=True,
            )
    train_s = time.monotonic() - t0
    model.eval()
    hx = chunks(held, 64, seed + 1)
    correct = total = 0
    with torch.no_grad():
        for i in range(0, len(hx), 16):
            x = torch.tensor(hx[i : i + 16], device=dev)
            pred = model(input_ids=x).logits.argmax(-1)
            correct += int((pred[:, :-1] == x[:, 1:]).sum())
            total += x[:, 1:].numel()
    model.to(torch.bfloat16 if dev.startswith("cuda") else torch.float32)
    model.save_pretrained(out_dir)
    regen_text.save_byte_tokenizer(out_dir)  # what trainer.regenerate / trainer.prepare load (ids = bytes)
    return {"train_seconds": train_s, "loss_curve": losses, "heldout_next_byte_accuracy": correct / total,
            "params": sum(p.numel() for p in model.parameters())}  # fmt: skip


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


def _launch(cfg, work, out, log_name, run, data, block, layers, arch, soft, schedule, anchor_run) -> tuple:
    """``trainer.pipeline`` for one drafter of this bench on ``data`` into ``run``: the bench's shared flags plus
    ``schedule`` (steps, epochs, learning rate, seed, ...); ``finish_drafter`` waits for it and reads it."""
    dev = "0" if cfg["device"].startswith("cuda") else "cpu"
    argv = [sys.executable, "-m", "trainer.pipeline", "--target-model", os.path.join(work, "target"),
            "--data-dir", os.path.join(work, data), "--output-dir", run, "--target-gpus", dev,
            "--drafter-gpus", dev, "--block-size", str(block), "--num-draft-layers", str(layers),
            "--max-anchors", "256", "--token-budget", str(cfg["budget"]), "--max-seq-len", str(SEQ),
            "--gamma", "7", "--mask-token-id", str(MASK), "--log-every", "50", "--resume", "none",
            "--anchor-run", str(anchor_run), "--est-anchors", str(cfg["est_anchors"]), *schedule]  # fmt: skip
    if arch:
        base, extra = VARIANTS.get(arch, (arch, []))
        argv += ["--arch", base, *extra]
    if soft:
        argv += ["--use-soft-labels"]
    log = open(os.path.join(out, log_name), "w")  # noqa: SIM115 (closed by finish_drafter)
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env(), cwd=ROOT)
    return proc, log, run, time.monotonic()


def tag_of(block: int, arch: str | None, text: str | None = None) -> str:
    """A drafter's name in the work directory (``run_<tag>``) and in the logs."""
    return f"b{block}" + (f"_{arch}" if arch else "") + (f"_{text}" if text else "")


def key_of(block: int, arch: str | None, text: str | None = None) -> str:
    """A drafter's key in results.json."""
    return f"block{block}" + (f"_{arch}" if arch else "") + (f"_{text}" if text else "")


def start_drafter(cfg, work, out, spec, seed, soft=True):
    """Train one drafter, ``spec`` = (block, layers, arch, text): on ``data_<text>`` when text is given, else
    on ``data`` (``finish_drafter`` waits for it and reads its records)."""
    block, layers, arch, text = spec
    tag = tag_of(block, arch, text)
    schedule = ["--max-steps", str(cfg["drafter_steps"]), "--epochs", "50", "--lr", "1e-3", "--warmup-ratio", "0.04",
                "--seed", str(seed)]  # fmt: skip
    run = os.path.join(work, f"run_{tag}")
    return _launch(
        cfg,
        work,
        out,
        f"train_{tag}.log",
        run,
        f"data_{text}" if text else "data",
        block,
        layers,
        arch,
        soft,
        schedule,
        cfg["anchor_run"],
    )


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


def start_frozen(cfg, work, out, spec, seed, data, steps, soft=True):
    """The estimate of one trained drafter with its weights frozen, on ``data`` (``data``: the training chunks
    it saw; ``heldout_data``: held-out chunks it never saw; ``generated``: the prompts and the text its real
    evaluation decoded, the target's own, every generated position a candidate anchor):
    ``trainer.pipeline --init-drafter`` its final checkpoint's training-dtype weights, ``--lr 1e-30`` (no fp32
    weight moves: far below their resolution), ``steps`` steps (epochs repeat a small set, anchors sampled
    anew), the same flags. Separates "seen in training" and "the data's text" from what real decoding sees."""
    block, layers, arch, text = spec
    tag = tag_of(block, arch, text)
    if data == "generated":
        data = f"generated_{tag}"
    ck = sorted(glob.glob(os.path.join(work, f"run_{tag}", "checkpoints", "step_*")))[-1]
    name = f"frozen_{tag}_{data.split('_b')[0]}"
    schedule = ["--max-steps", str(steps), "--epochs", "200", "--lr", "1e-30", "--warmup-ratio", "0",
                "--seed", str(seed + 7), "--init-drafter", os.path.join(ck, "drafter")]  # fmt: skip
    run = os.path.join(work, name)
    return _launch(
        cfg,
        work,
        out,
        f"{name}.log",
        run,
        data,
        block,
        layers,
        arch,
        soft,
        schedule,
        cfg["frozen_anchor_run"],
    )


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
        with open(os.path.join(d, "prompts.jsonl"), "w") as f:
            f.writelines(lines[cut[i] : cut[i + 1]])
        dirs.append((os.path.join(prompts, f"shard{i}"), cut[i + 1] - cut[i]))
    return dirs


def start_eval(cfg, work, out, spec, prompts="heldout", prompt_len=PROMPT):
    """Launch ``trainer.evaluate`` of one drafter's final export on a prompt set (``heldout``: held-out files;
    ``train``: chunks of the training files) cut to ``prompt_len`` bytes, as ``cfg["eval_shards"]`` processes
    side by side on consecutive slices of the prompts; ``finish_eval`` waits and pools them."""
    tag = tag_of(spec[0], spec[2], spec[3])
    name = "" if (prompts, prompt_len) == ("heldout", PROMPT) else f"_{prompts}{prompt_len}"
    shards = cfg.get("eval_shards", 1)
    sets = (
        [(prompts, cfg["prompts"])] if shards == 1 else shard_prompts(work, prompts, cfg["prompts"], shards)
    )
    procs = []
    for i, (pset, n) in enumerate(sets):
        argv = [sys.executable, "-m", "trainer.evaluate", "--target-model", os.path.join(work, "target"),
                "--drafter", os.path.join(work, f"run_{tag}"), "--prompts", os.path.join(work, pset),
                "--num-prompts", str(n), "--max-new-tokens", str(cfg["new"]), "--prompt-len",
                str(prompt_len), "--device", cfg["device"], "--ignore-eos", "--json"]  # fmt: skip
        if not name:
            # the main evaluation keeps the text it decoded: the target's own (--frozen-steps scores on it)
            argv += ["--save-outputs", os.path.join(work, f"generated_{tag}", f"out{i}.jsonl")]
        procs.append(
            subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(), cwd=ROOT
            )
        )
    return procs, os.path.join(out, f"eval_{tag}{name}.log"), time.monotonic()


def finish_eval(started) -> dict:
    procs, log_path, t0 = started
    reports, failed = [], None
    with open(log_path, "w") as f:
        for i, p in enumerate(procs):
            stdout, stderr = p.communicate()
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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default=None)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--small", action="store_true", help="a small CPU configuration (SMALL)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--blocks",
        default="8:2,16:3",
        help="block:layers[:arch],... (arch dflash, dflash2, or dflash2ug: dflash2 with --selector-unary-grad; e.g. 8:2:dflash,8:2:dflash2 compares DFlash 1 and 2 "
        "with the same data, steps, learning rate and block size)",
    )
    ap.add_argument(
        "--drafter-steps", type=int, default=None, help="optimizer steps per drafter (default: 400; tiny 20)"
    )
    ap.add_argument(
        "--eval-prompts",
        type=int,
        default=None,
        help="held-out prompts per evaluation (default: 32; small 16; tiny 4). The prompt, not the verify step, "
        "is what varies: a 16-prompt CPU evaluation read 3.62 where 464 prompts read 4.76 (docs/evaluate.md)",
    )
    ap.add_argument(
        "--eval-shards",
        type=int,
        default=1,
        help="run each evaluation as N processes side by side on consecutive slices of its prompts, pooled "
        "(report.pool): 128 prompts in the time of 32 on a GPU that one small-target evaluation leaves idle",
    )
    ap.add_argument(
        "--parallel", action="store_true", help="train all drafters at once, then evaluate all at once"
    )
    ap.add_argument(
        "--hard-labels", action="store_true", help="train on the data tokens (default: --use-soft-labels)"
    )
    ap.add_argument(
        "--anchor-run",
        type=int,
        default=1,
        help="the trainer's --anchor-run for training the drafters (1: scattered anchors, as the references; "
        "runs cost acceptance: docs/evaluate.md)",
    )
    ap.add_argument(
        "--frozen-anchor-run",
        type=int,
        default=16,
        help="--anchor-run of the frozen passes (16: runs, where the estimate's walk steps as decoding does)",
    )
    ap.add_argument(
        "--est-anchors",
        type=int,
        default=build_parser().get_default("est_anchors"),
        help="the trainer's --est-anchors for every run (measuring blocks: one run of M consecutive anchors per "
        "row beside the training ones, read by accept_len_est; 0: the walk over the training anchors)",
    )
    ap.add_argument(
        "--frozen-steps",
        type=int,
        default=0,
        help="after the evaluations, each drafter's estimate with frozen weights over N steps of the "
        "training chunks and of held-out chunks (0: none; at most 50, the running mean's window)",
    )
    ap.add_argument(
        "--train-text",
        choices=("data", "generated", "compare"),
        default="data",
        help="what the drafters train on: the training chunks (data), or the target's own greedy continuation "
        "of their first 128 bytes (generated: the usual recipe, responses regenerated by the target through "
        "trainer.regenerate; the loss on what the target wrote), or both of the same prompts side by side "
        "(compare: each --blocks drafter on the original next bytes and on the target's, paired on the "
        "evaluation's prompts)",
    )
    ap.add_argument(
        "--regen-batch",
        type=int,
        default=None,
        help="trainer.regenerate --batch-size (default: 1024 on a GPU, 64 on the CPU; one H200: 15.6K tok/s at 256, "
        "25.8K at 512, the step time bound by the host, not the GPU)",
    )
    ap.add_argument(
        "--gen-chunks",
        type=int,
        default=None,
        help="--train-text generated/compare: how many prompts (default: chunks / 2)",
    )
    ap.add_argument(
        "--gen-tokens",
        type=int,
        default=None,
        help="--train-text generated: bytes the target writes after each prompt (default: the evaluation's new "
        "tokens, so that the training text is the kind the evaluation decodes; a weak target's greedy text "
        "falls into loops further on, which drafters learn well: 384 bytes made the CPU estimate read 2x real)",
    )
    ap.add_argument(
        "--prompt-sets",
        default="",
        help="more evaluations of every drafter: set:len,... (set heldout or "
        "train (chunks of the training files); len: prompt bytes); the main one is heldout:128",
    )
    a = ap.parse_args()
    prompt_sets = [(x.split(":")[0], int(x.split(":")[1])) for x in a.prompt_sets.split(",") if x]
    cfg = dict(TINY if a.tiny else SMALL if a.small else FULL)
    cfg["anchor_run"], cfg["frozen_anchor_run"] = a.anchor_run, a.frozen_anchor_run
    cfg["est_anchors"] = a.est_anchors
    if a.drafter_steps:
        cfg["drafter_steps"] = a.drafter_steps
    if a.eval_prompts:
        cfg["prompts"] = a.eval_prompts
    if not 1 <= a.eval_shards <= cfg["prompts"]:
        ap.error(f"--eval-shards must be 1 .. the evaluation's prompts ({cfg['prompts']})")
    cfg["eval_shards"] = a.eval_shards
    work = a.work or ("/tmp/dflash_accept" if a.tiny or a.small else "/dev/shm/dflash_accept")
    fresh_work(work)
    os.makedirs(a.out, exist_ok=True)
    res: dict = {"config": cfg, "seed": a.seed, "command": sys.argv}

    def save() -> None:
        with open(os.path.join(a.out, "results.json"), "w") as f:
            json.dump(res, f, indent=1)

    t0 = time.monotonic()
    train, held, nfiles = corpus(200 if a.tiny else None)
    res["corpus"] = {"files": nfiles, "train_bytes": len(train), "heldout_bytes": len(held),
                     "python": sys.version.split()[0]}  # fmt: skip
    write_jsonl(os.path.join(work, "data", "train.jsonl"), chunks(train, cfg["chunks"], a.seed))
    write_jsonl(os.path.join(work, "heldout", "prompts.jsonl"), chunks(held, 4 * cfg["prompts"], a.seed + 2))
    write_jsonl(os.path.join(work, "train", "prompts.jsonl"), chunks(train, 4 * cfg["prompts"], a.seed + 3))
    n_frozen = a.frozen_steps * cfg["budget"] // SEQ + 64  # chunks for N frozen steps, with room to spare
    if a.frozen_steps:  # held-out chunks in the training format, for the frozen estimate
        write_jsonl(os.path.join(work, "heldout_data", "heldout.jsonl"), chunks(held, n_frozen, a.seed + 4))
    res["target"] = train_target(cfg, train, held, os.path.join(work, "target"), a.seed)
    res["phase_seconds"] = {"corpus_and_target": time.monotonic() - t0}
    cfg["train_text"] = a.train_text
    training_text(a, cfg, work, train, held, n_frozen, res)
    res["phase_seconds"]["training_text"] = time.monotonic() - t0
    save()
    specs = parse_specs(a.blocks, a.train_text)
    # --parallel: every drafter trains at once (this target is so small that one run leaves the GPU mostly
    # idle), then every evaluation runs at once; their speed-ups are then measured under that shared load
    for group in [specs] if a.parallel else [[x] for x in specs]:
        run_group(a, cfg, work, group, prompt_sets, res, save)
        res["phase_seconds"]["drafters" if a.parallel else key_of(group[0][0], group[0][2], group[0][3])] = (
            time.monotonic() - t0
        )
    res["total_seconds"] = time.monotonic() - t0
    save()
    return 0


def parse_specs(blocks: str, train_text: str) -> list[tuple]:
    """``--blocks`` as (block, layers, arch, text) tuples; ``--train-text compare`` trains each on both
    texts (text ``original`` and ``regenerated``), else text is None (the ``data`` directory)."""
    texts = ("original", "regenerated") if train_text == "compare" else (None,)
    specs = []
    for spec in blocks.split(","):
        parts = spec.split(":")
        for text in texts:
            specs.append((int(parts[0]), int(parts[1]), parts[2] if len(parts) > 2 else None, text))
    return specs


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
    summary = regen_text.regenerate(target, pairs, os.path.join(work, "regen"), cfg, log, env(), ROOT)
    summary["not_utf8_left_out"] = skipped
    res["generated_train_text"] = summary
    print(f"training text regenerated by the target: {json.dumps(summary)}", flush=True)
    name = "data_regenerated" if a.train_text == "compare" else "data"
    regen_text.prepare(target, summary["raw"], os.path.join(work, name), log, env(), ROOT)()
    if original is not None:
        original()
    elif a.frozen_steps:  # the same kind of text from held-out chunks' starts, for the frozen estimate
        pairs, _ = regen_text.text_pairs(chunks(held, n_frozen, a.seed + 4), PROMPT, cfg["regen_new"])
        rep = regen_text.regenerate(target, pairs, os.path.join(work, "regen_held"), cfg, log, env(), ROOT)
        res["generated_heldout_text"] = rep
        regen_text.prepare(target, rep["raw"], os.path.join(work, "heldout_gen"), log, env(), ROOT)()


def record_eval(res: dict, spec: tuple, d: dict, e: dict) -> None:
    block, layers, arch, text = spec
    real, est = e.get("mean_accept_len"), d.get("accept_len_est")
    est_uniform = d.get("accept_len_est_uniform")
    res[key_of(block, arch, text)] = {"layers": layers, "arch": arch or "dflash", "text": text or "data",
                                      "train": d, "eval": e,
                                      "estimate_over_real": est / real if real and est else None,
                                      "estimate_uniform_over_real": est_uniform / real if real and est_uniform else None}  # fmt: skip
    print(json.dumps({"block": block, "arch": arch or "dflash", "text": text or "data", "real": real, "est": est,
                      "est_vs": d.get("accept_len_est_vs"), "est_uniform": est_uniform, "old": d.get("accept_len_old"),
                      "speedup": e.get("speedup"), "eval_s": e.get("seconds")}), flush=True)  # fmt: skip


def paired_comparisons(res: dict, group: list[tuple], save) -> None:
    """Prompt by prompt: DFlash 2 (and its variants) against DFlash 1 of the same block and text (variants
    also against DFlash 2); regenerated-text drafters against the original-text ones of the same spec."""
    pairs = []
    for block, _, arch, text in group:
        for base in ("dflash", "dflash2"):
            if arch not in (None, "dflash", base):
                pairs.append((key_of(block, base, text), key_of(block, arch, text), f"{arch}_over_{base}"))
        if text == "regenerated":
            pairs.append(
                (key_of(block, arch, "original"), key_of(block, arch, text), "regenerated_over_original")
            )
    for one_key, two_key, what in pairs:
        one, two = res.get(one_key, {}).get("eval", {}), res.get(two_key, {}).get("eval", {})
        if "prompt_steps" in one and "prompt_steps" in two:
            res[f"{two_key}_vs_{one_key.removeprefix('block')}"] = cmp = paired_ratio(one, two)
            save()
            print(json.dumps({"drafters": [one_key, two_key], what: cmp}), flush=True)


def run_group(a, cfg, work, group: list[tuple], prompt_sets, res: dict, save) -> None:
    """Train the group's drafters side by side, then evaluate them side by side (and the extra prompt sets,
    the frozen passes)."""
    started = [(x, start_drafter(cfg, work, a.out, x, a.seed, soft=not a.hard_labels)) for x in group]
    trained = {x: finish_drafter(st) for x, st in started}
    save()
    evals = [(x, start_eval(cfg, work, a.out, x)) for x in group]
    extra = [((x, ps), start_eval(cfg, work, a.out, x, *ps)) for x in group for ps in prompt_sets]
    for x, st in evals:
        record_eval(res, x, trained[x], finish_eval(st))
        save()
    paired_comparisons(res, group, save)
    for (x, (ps, plen)), st in extra:  # the same drafters on other prompt sets
        e, key = finish_eval(st), key_of(x[0], x[2], x[3])
        res[key][f"eval_{ps}{plen}"] = e
        est, real = res[key]["train"].get("accept_len_est"), e.get("mean_accept_len")
        save()
        print(json.dumps({"drafter": key, "prompts": ps, "prompt_len": plen, "real": real,
                          "est_over_real": est / real if est and real else None}), flush=True)  # fmt: skip
    frozen_passes(a, cfg, work, group, res, save)


def frozen_passes(a, cfg, work, group: list[tuple], res: dict, save) -> None:
    datas = ("data", "heldout_data", "generated") + (("heldout_gen",) if a.train_text == "generated" else ())
    frozen = [
        ((x, data), start_frozen(cfg, work, a.out, x, a.seed, data, a.frozen_steps, soft=not a.hard_labels))
        for x in (group if a.frozen_steps else [])
        for data in datas
    ]
    for (x, data), st in frozen:
        d = finish_drafter(st)
        d.pop("loss_curve", None)
        key = key_of(x[0], x[2], x[3])
        res[key][f"frozen_{data}"] = d
        real = res[key]["eval"].get("mean_accept_len")
        save()
        print(json.dumps({"drafter": key, "frozen_on": data, "est": d.get("accept_len_est"),
                          "est_over_real": d["accept_len_est"] / real if d.get("accept_len_est") and real else None,
                          "steps": d.get("steps"), "rc": d.get("rc")}), flush=True)  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
