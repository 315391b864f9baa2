"""``status --check`` judges the run's whole history (issue 34, item 1): a run that finished by itself
long after its ``started`` record (far beyond the last MiB of metrics.jsonl) is OK, one that died
without a word is CRITICAL; neither is "none expected". Real files, the real CLI over the in-process
SSH server."""

from __future__ import annotations

import json

import pytest

from tests.support.core_util import CT, cli, conn_args
from tests.support.devhost import devhost_fixture

pytestmark = pytest.mark.e2e

T0 = 1_700_000_000.0


host = devhost_fixture(scope="module")


def _line(rec: dict) -> str:
    return json.dumps(rec) + "\n"


def write_run(run_dir, before: int, after: int, end: dict | None) -> int:
    """metrics.jsonl: ``before`` bytes of step records, ``started``, ``after`` bytes of step records,
    then ``end`` (a last event, or none); returns the byte offset of the ``started`` record."""
    run_dir.mkdir(parents=True)
    out, n, size = [], 0, 0
    started_at = None
    for budget in (before, after):
        stop = size + budget
        while size < stop:
            n += 1
            ln = _line(
                {"t": T0 + n, "kind": "step", "step": n, "total_steps": 10**6, "loss": 1.5, "lr": 1e-4}
            )
            out.append(ln)
            size += len(ln)
        if started_at is None:
            started_at = size
            ln = _line({"t": T0 + n, "kind": "event", "name": "started", "pid": 999999, "step": n})
            out.append(ln)
            size += len(ln)
    if end is not None:
        out.append(_line({"t": T0 + n + 1, "kind": "event", **end}))
    (run_dir / "metrics.jsonl").write_text("".join(out))
    return started_at


@pytest.mark.parametrize(
    ("end", "code", "said"),
    [
        (
            {"name": "stopped", "reason": "finished", "exit_code": 0},
            0,
            "DFLASH OK: no trainer running; the last run stopped cleanly (finished)",
        ),
        (None, 2, "DFLASH CRITICAL: trainer exited without a stop request"),
    ],
)
def test_check_reads_back_to_the_runs_start(host, tmp_path, end, code, said):
    run_dir = host.container_dir(CT) / "runs" / tmp_path.name
    at = write_run(run_dir, 575_000, 2_100_000, end)  # as reported: 2.67 MB, started at ~575K
    size = (run_dir / "metrics.jsonl").stat().st_size
    assert size - at > 2 << 20  # the start lies far outside the last MiB
    r = cli("status", *conn_args(host), "--run-dir", str(run_dir), "--check")
    assert r.returncode == code, r.stdout + r.stderr
    assert r.stdout.startswith(said), r.stdout


def test_check_without_any_start_is_unknown(host, tmp_path):
    run_dir = host.container_dir(CT) / "runs" / "never"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text(
        "".join(_line({"t": T0 + i, "kind": "step", "step": i, "loss": 1.0}) for i in range(30_000))
    )
    r = cli("status", *conn_args(host), "--run-dir", str(run_dir), "--check")
    assert r.returncode == 3, r.stdout + r.stderr
    assert "none expected (no run recorded)" in r.stdout
