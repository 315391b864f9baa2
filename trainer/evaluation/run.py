"""``python -m trainer.evaluate``: measured acceptance of a drafter by block speculative decoding (docs/evaluate.md).

``main(argv)`` parses the flags, loads the target (bf16 on CUDA, fp32 on CPU; ``--target-dtype fp8``: FP8
projections, refused before anything loads where the device cannot run them) and the drafter (the target's
dtype), reads the prompts, and for each prompt decodes with the target alone and speculatively (the same seed
for both at temperature > 0; the order alternates over the prompts), after one untimed warm-up prompt of each,
at ``--threads`` torch threads (default 1). A speed-up above the acceptance length, which bounds it, is reported
with a warning naming the likely cause (``report.speedup_warning``). Prints a text report, or with
``--json`` one JSON object (``report.summarize`` fields plus speed, greedy match and run facts). A progress
line goes to stderr when it is a terminal. Exit status: 0, 2 for bad input (``error: ...``), 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from trainer.evaluation.load import EvalError
from trainer.run.flags import finite_float

DEFAULT_THREADS = 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m trainer.evaluate",
        description="Real acceptance of a DFlash drafter: block speculative decoding against its target.",
    )
    p.add_argument("--target-model", required=True, help="the target's transformers directory")
    p.add_argument(
        "--drafter",
        required=True,
        help="drafter directory (trainer's or published), checkpoint or run directory",
    )
    p.add_argument("--prompts", required=True, help="JSONL file or directory of *.jsonl (docs/evaluate.md)")
    p.add_argument("--num-prompts", type=int, default=None, help="at most N prompts (default: all)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=finite_float, default=0.0)
    p.add_argument("--device", default=None, help="cpu or cuda:N (default: cuda:0 if there is one, else cpu)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (temperature > 0)")
    p.add_argument(
        "--dtype",
        choices=("auto", "bf16", "fp32"),
        default="auto",
        help="what target and drafter compute in: auto is bf16 on CUDA, fp32 on the CPU; bf16 on the CPU "
        "matches a server that runs bf16 there (vLLM's CPU Gated DeltaNet; docs/evaluate.md)",
    )
    p.add_argument(
        "--prompt-len", type=int, default=64, help="tokens of a plain-text line used as its prompt"
    )
    p.add_argument("--max-prompt-len", type=int, default=2048, help="longer prompts keep their last N tokens")
    p.add_argument(
        "--ignore-eos", action="store_true", help="do not stop at the target's end-of-sequence tokens"
    )
    p.add_argument(
        "--no-baseline", action="store_true", help="skip target-only decoding (no speed-up, no match)"
    )
    p.add_argument(
        "--save-outputs",
        default=None,
        metavar="FILE",
        help="write each prompt with its speculative output as a training-data JSONL line (input_ids, "
        "loss_mask 1 on the generated tokens): the target's own text, e.g. to score a drafter on it",
    )
    p.add_argument(
        "--rewind",
        choices=("states", "replay"),
        default="states",
        help="how a hybrid target's linear-attention state goes back to the accepted length: the state the "
        "verify forward reached at each position, kept (states, as servers do), or a second forward over the "
        "kept tokens (replay) (docs/evaluate.md)",
    )
    p.add_argument(
        "--target-dtype",
        choices=("bf16", "fp8"),
        default=None,
        help="the target's projections: fp8 (block-128 e4m3 on a Hopper GPU; an FP8 checkpoint read as stored, a "
        "bf16 one quantised on load) or bf16 (an FP8 checkpoint dequantised); default fp8 for an FP8 checkpoint, "
        "else bf16 (the trainer's --target-dtype; docs/evaluate.md)",
    )
    p.add_argument(
        "--fp8-scales",
        choices=("block", "row"),
        default=None,
        help="an FP8 target's scales: block (128 x 128, the checkpoint's and the servers' layout; default) or row "
        "(one per weight row and per token); FP8 targets only (the trainer's --fp8-scales; docs/evaluate.md)",
    )
    p.add_argument(
        "--engine",
        choices=("auto", "static", "cache"),
        default="auto",
        help="how target and drafter decode: static buffers and one forward per block size, as CUDA graphs on "
        "CUDA (static, as servers do), or transformers' cache and the drafter's growing cache (cache); auto: "
        "static on CUDA where the target is one it knows and --rewind is states, else cache (docs/evaluate.md)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=DEFAULT_THREADS,
        help="torch CPU threads, the same for both decoders (default 1: on a CPU, more threads than free cores "
        "slow the one-token baseline far more than the verify blocks, and inflate the speed-up; docs/evaluate.md)",
    )
    p.add_argument(
        "--progress-every",
        type=float,
        default=10.0,
        help="seconds between progress lines when stderr is not a terminal (a terminal gets a live bar)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the text report")
    p.add_argument("--parent-pid", type=int, default=None, help=argparse.SUPPRESS)  # exit when it is gone
    return p


def watch_parent(pid: int) -> None:
    """Exit (status 1) once the process that started this one is gone (the trainer's evaluations)."""
    import threading

    def watch() -> None:
        while os.getppid() == pid:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def check_args(a) -> None:
    for flag, v in (
        ("--max-new-tokens", a.max_new_tokens),
        ("--prompt-len", a.prompt_len),
        ("--max-prompt-len", a.max_prompt_len),
    ):
        if v < 1:
            raise EvalError(f"{flag}: must be >= 1, got {v}")
    if a.threads < 1:
        raise EvalError(f"--threads: must be >= 1, got {a.threads}")
    if a.num_prompts is not None and a.num_prompts < 1:
        raise EvalError(f"--num-prompts: must be >= 1, got {a.num_prompts}")
    if a.temperature < 0:
        raise EvalError(f"--temperature: must be >= 0, got {a.temperature}")
    if not os.path.isfile(os.path.join(a.target_model, "config.json")):
        raise EvalError(f"--target-model: {a.target_model!r} has no config.json")
    if (
        a.device is not None
        and a.device != "cpu"
        and not (a.device.startswith("cuda:") and a.device[5:].isdigit())
    ):
        raise EvalError(f"--device: expected cpu or cuda:N, got {a.device!r}")


class Progress:
    """Progress on stderr: on a terminal a bar rewritten in place, else a line at most every ``every``
    seconds (a log, a pipe: what a remote run shows), each with the acceptance and both decoders' tok/s so
    far; a last line at the end."""

    def __init__(self, total: int, mode: str | None, every: float = 10.0, stream=None):
        """``mode``: ``"tty"`` (a bar), ``"lines"`` or None (silent)."""
        self.total, self.mode, self.tty, self.every = total, mode, mode == "tty", every
        self.stream = stream or sys.stderr
        self._last = time.monotonic()

    def line(self, done: int, accept: float | None, spec_tok_s, target_tok_s) -> str:
        acc = f"  accept {accept:.2f}" if accept is not None else ""
        rates = "".join(
            f"  {name} {v:,.0f} tok/s" for name, v in (("spec", spec_tok_s), ("target", target_tok_s)) if v
        )
        if self.tty:
            w = 30
            fill = int(w * done / max(1, self.total))
            return f"[{'#' * fill}{'.' * (w - fill)}] {done}/{self.total} prompts{acc}{rates}"
        return f"evaluate: {done}/{self.total} prompts{acc}{rates}"

    def say(self, text: str) -> None:
        if self.mode is not None:
            self.stream.write(f"evaluate: {text}\n")
            self.stream.flush()

    def update(self, done: int, accept: float | None, spec_tok_s=None, target_tok_s=None) -> None:
        now = time.monotonic()
        if self.mode is None:
            return
        if self.tty:
            self.stream.write("\r" + self.line(done, accept, spec_tok_s, target_tok_s))
        elif done == self.total or now - self._last >= self.every:
            self._last = now
            self.stream.write(self.line(done, accept, spec_tok_s, target_tok_s) + "\n")
        else:
            return
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def save_outputs(path: str, outputs: list[tuple[list[int], list[int]]]) -> None:
    """Prompt + output per line in the training data's format (docs/trainer.md): the output's tokens trained."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        for prompt, out in outputs:
            rec = {"input_ids": prompt + out, "loss_mask": [0] * len(prompt) + [1] * len(out)}
            f.write(json.dumps(rec, separators=(",", ":")) + "\n")
    os.replace(tmp, path)


def _device(a):
    """The evaluation's device (``--device``, else cuda:0 when there is one) and its dtype (``--dtype``:
    auto is bf16 on CUDA, fp32 on the CPU)."""
    import torch

    device = a.device or ("cuda:0" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda"):
        if not torch.cuda.is_available() or int(device[5:]) >= torch.cuda.device_count():
            raise EvalError(f"--device: {device} does not exist on this machine")
        torch.cuda.set_device(device)
    if a.dtype == "auto":
        return device, (torch.bfloat16 if device.startswith("cuda") else torch.float32)
    return device, (torch.bfloat16 if a.dtype == "bf16" else torch.float32)


@dataclass
class _Setup:
    """What the prompts are decoded with."""

    drafter_dir: str
    target_dtype: str  # "bf16" / "fp8", as resolved (load.resolve_target_dtype)
    fp8_scales: str | None  # "block" / "row" for an FP8 target, None for a bf16 one
    fp8: dict  # load.fp8_linears
    prompts: list
    cfg: Any  # the drafter's config
    target: Any  # spec_decode.CachedTarget or static_target.StaticTarget
    proposer: Any  # drafter_cache.DrafterProposer or static_drafter.StaticProposer
    eos: set
    engine: str = "cache"  # "static" / "cache", as resolved (_engine)


def _engine(a, model, device: str) -> str:
    """``--engine`` resolved for this target: "static" or "cache" (an explicit "static" that cannot be is
    refused with the reason)."""
    from trainer.evaluation.static_target import static_target_problem

    problem = static_target_problem(model)
    if problem is None and a.rewind != "states":
        problem = "--rewind replay needs the cache engine"
    if a.engine == "static" and problem is not None:
        raise EvalError(f"--engine static: {problem}")
    if a.engine == "cache" or problem is not None:
        return "cache"
    return "static" if a.engine == "static" or device.startswith("cuda") else "cache"


def _graphed(st: _Setup) -> bool | None:
    """Whether the static engine's target and drafter steps all ran as CUDA graphs (None: the cache engine)."""
    if st.engine != "static":
        return None
    steps = [*st.target.steps.values(), *st.proposer.steps.values()]
    return bool(steps) and all(s is not None for s in steps)


def _decoders(a, st_engine: str, model, drafter, cfg, prompts):
    """(target, proposer) for the engine: static buffers sized for the longest prompt and its new tokens."""
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    if st_engine == "cache":
        from trainer.evaluation.drafter_cache import DrafterProposer
        from trainer.evaluation.spec_decode import CachedTarget

        return CachedTarget(model, cfg.target_layer_ids, rewind=a.rewind), DrafterProposer(
            drafter, embed, head
        )
    from trainer.evaluation.static_drafter import StaticProposer
    from trainer.evaluation.static_target import StaticTarget

    max_len = max(len(p) for p in prompts) + a.max_new_tokens + 2 * cfg.block_size + 1
    target = StaticTarget(model, cfg.target_layer_ids, max_len, graph_sizes=(1, cfg.block_size))
    return target, StaticProposer(drafter, embed, head, max_len)


def _load(a, device: str, dtype, target_dtype: tuple[str, bool]) -> _Setup:
    """The prompts (the tokenizer read only when a prompt is text), the drafter, then the target (as
    ``target_dtype``: ``load.resolve_target_dtype``'s)."""
    from trainer.evaluation.load import (
        eos_ids_of,
        fp8_linears,
        load_drafter_any,
        load_target_model,
        resolve_drafter_dir,
        target_text_config,
    )
    from trainer.evaluation.prompts import read_prompts

    drafter_dir = resolve_drafter_dir(a.drafter)
    tcfg = target_text_config(a.target_model)
    tokenizer = None

    def load_tok():
        nonlocal tokenizer
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(a.target_model, local_files_only=True)
        except (OSError, ValueError) as e:
            raise EvalError(f"--target-model: no tokenizer to read text prompts ({e})") from None
        return tokenizer

    prompts = read_prompts(
        a.prompts, load_tok, a.num_prompts, a.prompt_len, a.max_prompt_len, int(tcfg["vocab_size"])
    )
    drafter, cfg = load_drafter_any(drafter_dir, a.target_model, device, dtype)
    choice, ckpt_fp8 = target_dtype
    # a bf16 checkpoint served in bf16 loads as it always has (transformers' from_pretrained)
    model = load_target_model(
        a.target_model, device, dtype, None if choice == "bf16" and not ckpt_fp8 else choice, a.fp8_scales
    )
    engine = _engine(a, model, device)
    target, proposer = _decoders(a, engine, model, drafter, cfg, prompts)
    eos = set() if a.ignore_eos else eos_ids_of(model, tokenizer)
    fp8 = fp8_linears(model, device)
    scales = (a.fp8_scales or "block") if choice == "fp8" else None
    return _Setup(drafter_dir, choice, scales, fp8, prompts, cfg, target, proposer, eos, engine)


@dataclass
class _Tally:
    """The decoded prompts, summed."""

    # each prompt's acceptance length per verify step
    per_prompt: list[list[int]] = field(default_factory=list)
    accepted: int = 0  # their running sums, for the progress line
    verify_steps: int = 0
    spec_tokens: float = 0.0
    spec_s: float = 0.0
    base_tokens: float = 0.0
    base_s: float = 0.0
    mismatches: int = 0
    # divergence.divergence of each mismatch, with its prompt's index
    divergences: list = field(default_factory=list)
    rewinds: int = 0
    outputs: list = field(default_factory=list)


def _decode_one(a, st: _Setup, i: int, prompt, gen, t: _Tally) -> None:
    """One prompt both ways from the same seed, timed alike; the order alternates over the prompts (even:
    target alone first), so neither decoder always runs on caches the other just warmed."""
    from trainer.evaluation.divergence import divergence
    from trainer.evaluation.spec_decode import speculative_generate, target_generate

    def baseline():
        gen.manual_seed(a.seed * 1_000_003 + i)
        return target_generate(st.target, prompt, a.max_new_tokens, a.temperature, gen, st.eos)

    def speculative():
        gen.manual_seed(a.seed * 1_000_003 + i)
        return speculative_generate(
            st.target, st.proposer, prompt, a.max_new_tokens, a.temperature, gen, st.eos
        )

    base = None
    if a.no_baseline:
        spec = speculative()
    elif i % 2 == 0:
        base, spec = baseline(), speculative()
    else:
        spec, base = speculative(), baseline()
    if base is not None:
        t.base_tokens += len(base.tokens)
        t.base_s += base.decode_s
    t.spec_tokens += len(spec.tokens)
    t.spec_s += spec.decode_s
    t.per_prompt.append(list(spec.accept_lens))
    t.accepted += sum(spec.accept_lens)
    t.verify_steps += len(spec.accept_lens)
    t.outputs.append((list(prompt), list(spec.tokens)))
    t.rewinds += spec.rewind_forwards
    if base is not None and a.temperature <= 0 and base.tokens != spec.tokens:
        t.mismatches += 1
        t.divergences.append({"prompt": i, **divergence(st.target, prompt, base.tokens, spec.tokens)})


def _decode_prompts(a, st: _Setup, device: str, show_progress: str | None) -> _Tally:
    """Per prompt: the target alone (unless ``--no-baseline``) and speculative decoding, from one seed."""
    import torch

    from trainer.evaluation.spec_decode import speculative_generate, target_generate

    gen = torch.Generator(device=device)
    progress = Progress(len(st.prompts), show_progress, a.progress_every)
    warm = "capturing CUDA graphs, warming up" if st.engine == "static" and device != "cpu" else "warming up"
    progress.say(
        f"{len(st.prompts)} prompt(s) x {a.max_new_tokens} new tokens on {device} ({st.engine}, "
        f"{torch.get_num_threads()} thread(s)); {warm}"
    )
    # warm-up (untimed), both decoders alike: kernels, allocator, caches
    w_new = min(8, a.max_new_tokens)
    target_generate(st.target, st.prompts[0], w_new, 0.0, None, st.eos)
    speculative_generate(st.target, st.proposer, st.prompts[0], w_new, 0.0, None, st.eos)

    t = _Tally()
    for i, prompt in enumerate(st.prompts):
        _decode_one(a, st, i, prompt, gen, t)
        progress.update(
            i + 1,
            t.accepted / t.verify_steps if t.verify_steps else None,
            t.spec_tokens / t.spec_s if t.spec_s > 0 else None,
            t.base_tokens / t.base_s if t.base_s > 0 else None,
        )
    progress.close()
    return t


def _report(a, st: _Setup, t: _Tally, device: str, dtype, t_start: float) -> dict:
    import torch

    from trainer.evaluation.divergence import summary
    from trainer.evaluation.report import over_prompts, speedup_warning, summarize

    spec_tok_s = t.spec_tokens / t.spec_s if t.spec_s > 0 else None
    target_tok_s = t.base_tokens / t.base_s if t.base_s > 0 else None
    greedy = a.temperature <= 0 and not a.no_baseline
    report = {
        **summarize([n for lens in t.per_prompt for n in lens], st.cfg.block_size),
        **over_prompts(t.per_prompt),
        "block_size": st.cfg.block_size,
        "prompts": len(st.prompts),
        "max_new_tokens": a.max_new_tokens,
        "new_tokens": int(t.spec_tokens),
        "temperature": a.temperature,
        "device": device,
        "dtype": str(dtype).removeprefix("torch."),
        "target_dtype": st.target_dtype,
        "fp8_scales": st.fp8_scales,
        **st.fp8,
        "spec_tok_s": spec_tok_s,
        "target_tok_s": target_tok_s,
        "speedup": spec_tok_s / target_tok_s if spec_tok_s and target_tok_s else None,
        "rewind": a.rewind,
        "engine": st.engine,
        "cuda_graphs": _graphed(st),
        "rewind_forwards": t.rewinds,
        "greedy_match": (t.mismatches == 0) if greedy else None,
        "greedy_mismatches": t.mismatches if greedy else None,
        **(summary(t.divergences) if greedy else {}),
        "drafter": os.path.abspath(st.drafter_dir),
        "target": os.path.abspath(a.target_model),
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "load_average": round(os.getloadavg()[0], 2),
        "seconds": time.monotonic() - t_start,
    }
    return {**report, "speedup_warning": speedup_warning(report)}


def evaluate(a, show_progress: str | None = None) -> dict:
    """Load, decode every prompt both ways, save the outputs if asked; the report's fields."""
    import torch  # before the clock starts: the report's "seconds" leave torch's import out

    from trainer.evaluation.load import resolve_target_dtype

    torch.set_num_threads(a.threads)  # both decoders, every prompt: --threads (docs/evaluate.md)
    t_start = time.monotonic()
    device, dtype = _device(a)
    resolved = resolve_target_dtype(a.target_model, a.target_dtype, device, a.fp8_scales)
    st = _load(a, device, dtype, resolved)
    tally = _decode_prompts(a, st, device, show_progress)
    if a.save_outputs:
        save_outputs(a.save_outputs, tally.outputs)
    return _report(a, st, tally, device, dtype, t_start)


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    if a.parent_pid is not None:
        watch_parent(a.parent_pid)
    try:
        check_args(a)
        report = evaluate(a, show_progress="tty" if sys.stderr.isatty() else "lines")
    except EvalError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    if a.json:
        if report["speedup_warning"]:  # the text report has it as a line of its own
            print(f"warning: {report['speedup_warning']}", file=sys.stderr, flush=True)
        print(json.dumps(report), flush=True)
    else:
        from trainer.evaluation.report import format_report

        print(
            format_report(
                {
                    **report,
                    "speedup": report["speedup"] or 0.0,
                    "spec_tok_s": report["spec_tok_s"] or 0.0,
                    "target_tok_s": report["target_tok_s"] or 0.0,
                }
            ),
            flush=True,
        )
    return 0
