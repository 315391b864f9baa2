"""One-shot status of a host's trainer, for ``dflash-console status`` (text and ``--json``).

``collect(session)`` reads what is there now: the trainer (verified in /proc), run.json, the recent
records of metrics.jsonl (last step, throughput, checkpoint, stop events) and one nvidia-smi query.
"""

from __future__ import annotations

import shlex
import time

from console.core.devices import join_devices
from console.core.drafter_arch import arch_text, drafter_arch
from console.core.events import Gpu
from console.core.formatting import fmt_age, fmt_duration
from console.core.helper import Helper, HelperError
from console.core.metrics import TOK_S_WINDOW_S, headline_tok_s
from console.core.place import from_json, to_json
from console.core.remote_files import recent_records
from console.core.session import Session
from console.core.startup_fold import StartupFold, StartupView
from console.core.startup_fold import line as startup_line
from console.core.telemetry import nvidia_smi_argv, parse_output


async def collect(session: Session) -> dict:
    helper = session.need_helper()
    trainer = await session.find_trainer()
    run_dir = session.run_dir
    out: dict = {
        "host": session.options.display,
        **to_json(session.place),  # "ct": the container (None on the host)
        "helper": {k: helper.hello.get(k) for k in ("pid", "python", "python_version", "hostname", "pidfd")},
        "run_dir": run_dir,
        "trainer": None,
        "run": session.run,
        "drafter": drafter_arch(session.run),
        "last_step": None,
        "throughput": None,
        "tok_s": None,
        "last_checkpoint": None,
        "last_eval": None,
        "accept_len": None,
        "last_event": None,
        "gpus": None,
        "gpu_detail": "",
        "startup": None,
        "t": time.time(),
    }
    if trainer is not None:
        out["trainer"] = {
            "pid": trainer.pid,
            "start_time": trainer.start_time,
            "cmdline": trainer.cmdline,
            "run_dir": trainer.run_dir,
            "source": trainer.source,
        }
    if run_dir:
        fold = StartupFold()
        rates: list[tuple[float, float]] = []  # (record t, drafters' tok/s) of every throughput record
        for rec in await recent_records(helper, run_dir):
            fold.apply(rec)
            kind = rec.get("kind")
            if kind == "step":
                out["last_step"] = rec
            elif kind == "throughput":
                out["throughput"] = rec
                if isinstance(rec.get("t"), (int, float)):
                    rates.append((float(rec["t"]), headline_tok_s(rec)))
            elif kind == "eval":
                out["last_eval"] = rec
            elif kind == "event":
                out["last_event"] = rec
                if rec.get("name") == "checkpoint_saved":
                    out["last_checkpoint"] = rec
        out["tok_s"] = mean_tok_s(rates)
        view = fold.view(out["t"])
        out["startup"] = view.to_dict() if view is not None else None
    out["accept_len"] = acceptance(out["last_eval"], out["last_step"])
    out["job"] = await session.job_state()
    out.update(await _gpus(helper, out["throughput"], out["run"]))
    return out


def mean_tok_s(rates: list[tuple[float, float]], window_s: float = TOK_S_WINDOW_S) -> float | None:
    """The drafters' tok/s as a mean over the last ``window_s`` of record time, as the screen shows it: a
    trainer's throughput windows can be shorter than a step, so one record alone is 0 or a burst."""
    if not rates:
        return None
    newest = max(t for t, _ in rates)
    recent = [v for t, v in rates if newest - t <= window_s]
    return sum(recent) / len(recent)


def tok_s_text(st: dict) -> str:
    """``tok/s 3535 (drafters, 10 s mean)  queue 4/8``, with ``last known, 5m ago`` when no trainer runs."""
    q = (st["throughput"] or {}).get("queue") or {}
    when = "" if st["trainer"] else f"; last known, {fmt_age((st['throughput'] or {}).get('t'), st['t'])}"
    return (
        f"tok/s {st['tok_s']:.0f} (drafters, {TOK_S_WINDOW_S:.0f} s mean{when})  "
        f"queue {q.get('depth', '?')}/{q.get('capacity', '?')}"
    )


def ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


NVIDIA_SMI_TIMEOUT_S = 10.0  # a hung one (a lost GPU, a stuck driver) is killed, its children too


async def _gpus(helper: Helper, throughput, run) -> dict:
    """``{"gpus": [...]}`` from one nvidia-smi query, or ``{"gpu_detail": why not}``."""
    try:
        r = await helper.run(nvidia_smi_argv(None), timeout=NVIDIA_SMI_TIMEOUT_S)
    except HelperError as e:
        return {"gpu_detail": f"nvidia-smi is not available ({e})"}
    if r.get("timed_out"):
        return {"gpu_detail": f"nvidia-smi timed out after {NVIDIA_SMI_TIMEOUT_S:.0f} s (killed)"}
    if r["rc"] == 0:
        return {"gpus": gpu_entries(parse_output(r["stdout"]), throughput, run)}
    said = (r["stderr"] or r["stdout"]).strip()[:200]
    return {"gpu_detail": f"nvidia-smi failed (exit code {r['rc']})" + (f": {said}" if said else "")}


def job_text(job: dict | None) -> str | None:
    """``job 12 RUNNING on node1, 3:21 used, 56:39 left`` / ``job 13 PENDING (Priority), 2nd of 5 pending in
    gpu``."""
    if not job:
        return None
    if "error" in job:
        return f"job: {job['error']}"
    parts = [f"job {job['job']} {job['state']}" + (f" ({job['reason']})" if job.get("reason") else "")]
    if job.get("nodes"):
        parts[0] += f" on {job['nodes']}"
    if job.get("position"):
        parts.append(
            f"{ordinal(job['position'])} of {job['queued']} pending in {job.get('partition') or '?'}"
        )
    if job.get("used_s") is not None and job["state"] != "PENDING":
        parts.append(f"{fmt_duration(job['used_s'])} used")
    if job.get("left_s") is not None:
        parts.append(f"{fmt_duration(job['left_s'])} left")
    return ", ".join(parts)


def acceptance(last_eval: dict | None, last_step: dict | None) -> dict | None:
    """``{"value", "source", "step"}``: the newest ``eval`` record's measured acceptance length (source
    ``eval``; with ``se``, its standard error over the evaluation's prompts, where the record has one), else
    the last step's running estimate (``estimate``), else an old run's product formula (``old``)."""

    def num(v):
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    if last_eval and num(last_eval.get("accept_len")):
        out = {"value": last_eval["accept_len"], "source": "eval", "step": last_eval.get("step")}
        if num(last_eval.get("accept_len_se")):
            out["se"] = last_eval["accept_len_se"]
        return out
    for key, source in (("accept_len_est", "estimate"), ("accept_len", "old")):
        if last_step and num(last_step.get(key)):
            return {"value": last_step[key], "source": source, "step": last_step.get("step")}
    return None


def gpu_entries(gpus: list[Gpu], throughput: dict | None, run: dict | None) -> list[dict]:
    """Each GPU as a dict with the role, device and tok/s of the trainer device joined to it by the
    screen's rule (console/core/devices.py: uuid, then CUDA_VISIBLE_DEVICES, then cuda:N = GPU N)."""
    return [
        {
            **g.__dict__,
            "role": (d or {}).get("role"),
            "device": (d or {}).get("device"),
            "tok_s": (d or {}).get("tok_s"),
        }
        for g, d in join_devices(gpus, throughput, run)
        if g is not None
    ]


def accept_part(acc: dict | None) -> str | None:
    if not acc:
        return None
    if acc["source"] == "eval":
        se = f" +- {acc['se']:.2f}" if "se" in acc else ""
        return f"accept_len {acc['value']:.2f}{se} (measured, step {acc['step']})"
    if acc["source"] == "estimate":
        return f"accept_len {acc['value']:.2f} (estimate)"
    return f"accept_len {acc['value']:.2f}"


def format_text(st: dict) -> str:
    now = st["t"]
    lines = [
        from_json(st).at(f"host: {st['host']}", "  ")
        + f"  (helper pid {st['helper']['pid']} on {st['helper']['hostname']})"
    ]
    tr = st["trainer"]
    job = st.get("job")
    if job_text(job):
        lines.append(job_text(job))
    if tr is None and job and job.get("state") == "PENDING":
        lines.append(
            f"trainer: waiting for Slurm job {job['job']} to start ({job.get('reason') or 'pending'})"
        )
    elif tr is None:
        lines.append("trainer: none running" + (f" for {st['run_dir']}" if st["run_dir"] else ""))
    else:
        lines.append(f"trainer: pid {tr['pid']} (found by {tr['source']})")
        lines.append(f"  command: {shlex.join(tr['cmdline'])}")
    if st["run_dir"]:
        lines.append(f"run dir: {st['run_dir']}")
    if st.get("drafter"):
        lines.append(f"drafter: {arch_text(st['drafter'])}")
    su = st.get("startup")
    if su and (su["active"] or tr is not None):
        lines.append("  start-up: " + startup_line(StartupView(**su)))
    step = st["last_step"]
    if step:
        acc = step.get("acc") or []
        parts = [
            f"step {step.get('step')}/{step.get('total_steps')}",
            f"epoch {step.get('epoch', 0):.2f}" if isinstance(step.get("epoch"), (int, float)) else None,
            f"loss {step['loss']:.4f}" if isinstance(step.get("loss"), (int, float)) else None,
            accept_part(st.get("accept_len")),
            f"acc@1 {acc[0]:.3f}" if acc and isinstance(acc[0], (int, float)) else None,
            f"lr {step['lr']:.2e}" if isinstance(step.get("lr"), (int, float)) else None,
            f"({fmt_age(step.get('t'), now)})",
        ]
        lines.append("  " + "  ".join(p for p in parts if p))
    if st["throughput"] and st["tok_s"] is not None:
        lines.append("  " + tok_s_text(st))
    ck = st["last_checkpoint"]
    if ck:
        lines.append(
            f"  last checkpoint: step {ck.get('step')} {ck.get('path')} ({fmt_age(ck.get('t'), now)})"
        )
    ev = st["last_event"]
    if ev and tr is None:
        lines.append(f"  last event: {ev.get('name')} ({fmt_age(ev.get('t'), now)})")
    if st["gpus"]:
        for g in st["gpus"]:
            lines.append(
                f"  gpu {g['index']} {g['name']}: {g['util']}% {g['mem_used']}/{g['mem_total']} MiB "
                f"{g['power']} W {g['temp']} C" + (f"  [{g['role']}]" if g.get("role") else "")
            )
    else:
        lines.append(f"gpus: {st['gpu_detail'] or 'none'}")
    return "\n".join(lines)


def format_line(label: str, st: dict | None, error: str | None = None) -> str:
    """One line of a run for ``status`` over several targets (``error``: why it could not look)."""
    if st is None:
        return f"{label}: unreachable: {error}"
    now = st["t"]
    tr = st["trainer"]
    parts = [f"{label}:", f"pid {tr['pid']}" if tr else "no trainer"]
    if job_text(st.get("job")):
        parts.append(f"[{job_text(st.get('job'))}]")
    step = st["last_step"]
    if step:
        parts.append(f"step {step.get('step')}/{step.get('total_steps')}")
        if isinstance(step.get("loss"), (int, float)):
            parts.append(f"loss {step['loss']:.4f}")
        acc = accept_part(st.get("accept_len"))
        if acc:
            parts.append(acc)
    if st["tok_s"] is not None:
        parts.append(tok_s_text(st))
    ck = st["last_checkpoint"]
    if ck:
        parts.append(f"ckpt step {ck.get('step')} ({fmt_age(ck.get('t'), now)})")
    if st["run_dir"]:
        parts.append(f"[{st['run_dir']}]")
    return "  ".join(parts)
