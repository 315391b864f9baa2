"""metrics.jsonl on a full or failing disk (trainer/run/rundir.py MetricsWriter): a record whose write
fails with ENOSPC/EIO is dropped (no torn line is left), said once per streak with the free space,
counted, and a `metrics_dropped` event with the count precedes the first record written again; other
errors still raise. A real full tmpfs (``unshare -rm``, as in test_checkpoint_faults.py) where the kernel
allows it, and the tests' fault ``DFLASH_TEST_ENOSPC_METRICS`` (tests/support/faults.py)."""

from __future__ import annotations

import errno
import json
import shutil
import subprocess
import sys

import pytest

from tests.support import faults
from tests.support.trainer_run import ROOT, env, records, run, tiny_flags
from trainer.run import rundir
from trainer.run.rundir import MetricsWriter


def _lines(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]  # every line a whole record


def test_hooked_enospc_drops_counts_says_once_and_notes_the_count(tmp_path, monkeypatch):
    faults.patch_metrics(rundir, {2, 3}, monkeypatch.setattr)  # the 2nd and 3rd writes hit a full disk
    said: list[str] = []
    w = MetricsWriter(str(tmp_path / "metrics.jsonl"), err=said.append)
    heard: list[int] = []
    w.listeners.append(lambda rec: heard.append(rec.get("step")))
    for step in range(1, 6):
        w.write("step", step=step, loss=1.0)
    w.close()
    recs = _lines(tmp_path / "metrics.jsonl")
    assert [(r["kind"], r.get("step", r.get("count"))) for r in recs] == [
        ("step", 1),
        ("event", 2),  # the note: two records were lost ...
        ("step", 4),  # ... and the training's records go on
        ("step", 5),
    ]
    assert recs[1]["name"] == "metrics_dropped" and recs[1]["count"] == 2
    assert recs[1]["since"] == pytest.approx(recs[0]["t"], abs=60)
    assert w.dropped == 0 and w.dropped_total == 2
    assert heard == [1, 2, 3, 4, 5]  # in-process listeners (evaluation) get every record
    assert len(said) == 2, said  # once when the streak began, once when it ended
    assert "No space left on device" in said[0] and "MB free on" in said[0] and "training goes on" in said[0]
    assert "2 record(s) were dropped" in said[1]


class _Failing:
    """A raw file that fails its writes with ``err`` while ``fail`` is set (after writing ``part``)."""

    def __init__(self, f, err: int):
        self.f, self.err, self.fail, self.part = f, err, False, 5

    def write(self, data):
        if self.fail:
            self.f.write(bytes(data[: self.part]))
            raise OSError(self.err, "injected")
        return self.f.write(data)

    def fileno(self):
        return self.f.fileno()

    def close(self):
        self.f.close()


def test_eio_is_dropped_too_and_other_errors_raise(tmp_path):
    said: list[str] = []
    w = MetricsWriter(str(tmp_path / "metrics.jsonl"), err=said.append)
    w._f = _Failing(w._f, errno.EIO)
    w.write("step", step=1)
    w._f.fail = True
    w.write("step", step=2)
    w.write("throughput", step=2)
    assert w.dropped == 2 and len(said) == 1
    w._f.fail = False
    w.write("step", step=3)
    assert [r.get("name", r["kind"]) for r in _lines(tmp_path / "metrics.jsonl")] == [
        "step",
        "metrics_dropped",
        "step",
    ]
    w._f.err, w._f.fail = errno.EBADF, True
    with pytest.raises(OSError) as e:
        w.write("step", step=4)
    assert e.value.errno == errno.EBADF


WRITER = """
import json, os, sys
from tests.support import faults
from trainer.run import rundir
from trainer.run.rundir import MetricsWriter
mnt = sys.argv[1]
w = MetricsWriter(os.path.join(mnt, "metrics.jsonl"))
w.write("step", step=1)
with open(os.path.join(mnt, "filler"), "wb", buffering=0) as f:  # fill the disk
    try:
        while True:
            f.write(b"f" * 4096)
    except OSError:
        pass
for step in (2, 3, 4):
    w.write("step", step=step, pad="x" * 5000)
os.remove(os.path.join(mnt, "filler"))
w.write("step", step=5)
w.close()
print(json.dumps({"dropped_total": w.dropped_total, "text": open(os.path.join(mnt, "metrics.jsonl")).read()}))
"""


def test_a_real_full_tmpfs_drops_records_and_notes_them_after(tmp_path):
    probe = tmp_path / "probe"
    probe.mkdir()
    ok = shutil.which("unshare") and (
        subprocess.run(
            ["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {probe}"], timeout=30
        ).returncode
        == 0
    )
    if not ok:
        pytest.skip("no tmpfs can be mounted here (unshare -rm refused)")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    cmd = f"mount -t tmpfs -o size=64k tmpfs {mnt} && exec {sys.executable} {script} {mnt}"
    r = subprocess.run(
        ["unshare", "-rm", "sh", "-c", cmd], cwd=ROOT, env=env(), capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    recs = [json.loads(x) for x in out["text"].splitlines()]  # no torn line left by the failed writes
    assert out["dropped_total"] == 3, out["text"]
    assert [r.get("step", r.get("count")) for r in recs] == [1, 3, 5], out["text"][:3000]
    assert recs[1]["name"] == "metrics_dropped"
    assert r.stderr.count("metrics.jsonl: a write failed") == 1 and "No space left on device" in r.stderr


@pytest.mark.e2e
def test_the_real_trainer_trains_on_through_failed_metrics_writes(tiny_assets, tmp_path):
    """Metrics writes 12 to 17 of the real tiny trainer fail as on a full disk: it finishes (exit 0)
    with every step it trained, the lost records counted in a `metrics_dropped` event."""
    out = tmp_path / "run"
    flags = tiny_flags(tiny_assets, out, "--max-steps", "12", "--log-every", "1")
    rc, output = run(flags, DFLASH_TEST_ENOSPC_METRICS="12,13,14,15,16,17")
    assert rc == 0, output
    recs = records(out)
    notes = [r for r in recs if r.get("name") == "metrics_dropped"]
    assert [n["count"] for n in notes] == [6], notes
    assert recs[-1]["name"] == "stopped" and recs[-1]["reason"] == "finished"
    assert max(r["step"] for r in recs if r["kind"] == "step") == 12
    assert output.count("metrics.jsonl: a write failed") == 1 and "6 record(s) were dropped" in output
