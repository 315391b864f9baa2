"""The train/serve check of a launch: the trainer's ``python -m trainer.serve_check`` run in the place, with
the launch's interpreter, code, env and cwd, on the launch's own trainer flags (docs/serving.md).

It runs where the target names how its drafter will be served (``serve = "vllm:PORT"``, ``serve_thinking``
in its config entry; ``--serve`` / ``--serve-thinking`` for ``launch``): the drafter config those flags will
export, checked against that server's rules, the target's template and embedding and the data's
``prepare.json``. :class:`ServeCheck` is what came of it: ``failed`` (an error: the launch is refused unless
the operator accepts those lines), ``ok`` (warnings said, never blocking), ``skipped`` (no serving named),
or ``not run`` (a timeout, a trainer too old to have it, flags it refused: said, never blocking; the trainer
itself says what is wrong with its flags). Its output is bounded (:data:`MAX_OUTPUT`) and decoded by the
one bounded JSON reader; every line shown is cleaned (sanitize.py)."""

from __future__ import annotations

import shlex
from collections.abc import Collection
from dataclasses import dataclass

from console.core.helper import Helper, HelperError
from console.core.sanitize import BadJson, clean_text, loads
from console.core.serving import Endpoint

MODULE = "trainer.serve_check"
TIMEOUT_S = 120.0  # transformers' AutoConfig and a tokenizer.json read: seconds; a loaded box: more
MAX_OUTPUT = 256 << 10
MAX_PROBLEMS = 50  # lines shown at most (the rest counted)
MAX_LINE = 400
NO_SERVING = (
    'the target names no serving: `serve = "vllm:PORT"` (and `serve_thinking = "on"|"off"`) in its config '
    "entry, or launch --serve KIND:PORT [--serve-thinking on|off]"
)


@dataclass(frozen=True)
class ServeCheck:
    state: str  # "ok" | "failed" | "skipped" | "not run"
    summary: str  # one line: what was checked, or why not
    errors: tuple[str, ...] = ()  # "vllm: error: KEY: what" (cleaned)
    warnings: tuple[str, ...] = ()

    def blocks(self, accepted: Collection[str] | bool = False) -> bool:
        """An error the operator has not accepted (``accepted``: True for all, else the lines accepted)."""
        return self.state == "failed" and accepted is not True and not set(self.errors) <= set(accepted or ())

    def lines(self) -> list[str]:
        return [f"serve check: {self.summary}", *(f"  {x}" for x in (*self.errors, *self.warnings))]


def skipped(why: str = NO_SERVING) -> ServeCheck:
    return ServeCheck("skipped", f"skipped: {why}")


def argv(python: str, flags: list[str], endpoint: Endpoint) -> list[str]:
    thinking = ["--serve-thinking", endpoint.thinking] if endpoint.thinking else []
    return [python, "-m", MODULE, "--serve", endpoint.kind, *thinking, "--json", "--", *flags]


def _what(endpoint: Endpoint) -> str:
    thinking = f"thinking {endpoint.thinking}" if endpoint.thinking else "thinking not set: not compared"
    return f"{endpoint} ({thinking})"


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").strip().splitlines() if ln.strip()]
    return clean_text(lines[-1][:MAX_LINE]) if lines else "no output"


def _problems(doc: object) -> tuple[list[str], list[str]]:
    """``(error lines, warning lines)`` of the check's JSON (``BadJson`` when it is not that)."""
    servers = doc.get("servers") if isinstance(doc, dict) else None
    if not isinstance(servers, dict):
        raise BadJson("no servers object")
    errors, warnings = [], []
    for server, res in list(servers.items())[:4]:
        for p in (res.get("problems") if isinstance(res, dict) else None) or []:
            if not isinstance(p, dict):
                raise BadJson("a problem is not an object")
            line = clean_text(f"{server}: {p.get('severity')}: {p.get('key')}: {p.get('message')}")[:MAX_LINE]
            (errors if p.get("severity") == "error" else warnings).append(line)
    return errors, warnings


def _bounded(lines: list[str]) -> tuple[str, ...]:
    more = len(lines) - MAX_PROBLEMS
    return tuple(lines[:MAX_PROBLEMS] + ([f"... and {more} more"] if more > 0 else []))


def verdict(r: dict, endpoint: Endpoint, timeout: float) -> ServeCheck:
    """What the helper's ``run`` reply ``r`` of :func:`argv` says."""
    what = _what(endpoint)
    if r.get("timed_out"):
        return ServeCheck("not run", f"{what}: did not finish within {timeout:.0f} s; launching without it")
    rc, err = r.get("rc"), str(r.get("stderr") or "")
    if rc != 0 and f"No module named {MODULE}" in err:  # python -m exits 1 for a missing module
        why = f"the trainer's code has no {MODULE} (older than the check): deploy the bundled trainer"
        return ServeCheck("not run", f"{what}: not run: {why}")
    if rc not in (0, 1):
        if rc == 2:
            why = f"it refused the flags ({_last_line(err)}): the trainer will say the same"
        else:
            why = f"exit code {rc} ({_last_line(err)})"
        return ServeCheck("not run", f"{what}: not run: {why}")
    try:
        errors, warnings = _problems(loads(str(r.get("stdout") or ""), max_bytes=MAX_OUTPUT))
    except BadJson as e:
        return ServeCheck("not run", f"{what}: its output is not the check's JSON ({e})")
    if rc == 1 and not errors:
        return ServeCheck("not run", f"{what}: exit code 1 with no error line")
    n = len(warnings)
    tail = f", {n} warning{'s' if n != 1 else ''}" if n else ""
    state = "failed" if errors else "ok"
    head = f"{len(errors)} error{'s' if len(errors) != 1 else ''}{tail}" if errors else f"ok{tail}"
    return ServeCheck(state, f"{what}: {head}", _bounded(errors), _bounded(warnings))


async def run(
    helper: Helper,
    flags: list[str],
    endpoint: Endpoint,
    *,
    python: str,
    env: dict[str, str],
    cwd: str | None,
    timeout: float = TIMEOUT_S,
) -> ServeCheck:
    """Run the check in the place (never raises for the check's own failure: a :class:`ServeCheck`)."""
    cmd = argv(python, flags, endpoint)
    try:
        r = await helper.call(
            "run", argv=cmd, cwd=cwd, env=env, timeout=timeout, max_output=MAX_OUTPUT, input=None
        )
    except HelperError as e:
        return ServeCheck("not run", f"{_what(endpoint)}: cannot run {shlex.join(cmd[:3])} ({e})")
    return verdict(r if isinstance(r, dict) else {}, endpoint, timeout)


def refusal(check: ServeCheck, override: str) -> str:
    """The refused launch's message: the errors and the way on."""
    return "\n".join(
        [
            f"refused: the train/serve check fails ({check.summary})",
            *(f"  {x}" for x in check.errors),
            *(f"  {x}" for x in check.warnings),
            "fix the trainer flags or the data (docs/serving.md, Train/serve checks), or launch anyway: "
            + override,
        ]
    )
