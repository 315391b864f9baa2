"""Text from the container reaches no terminal raw (issue 33, items 1 and 9): ``dflash-console`` as a real
subprocess against the in-process SSH server, a process whose command line, metrics records and a log
holding OSC 52 (clipboard), OSC 0 (title), CSI and C1 controls; and record files, hostile or huge."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest

from tests.support.core_util import CLI, CT, alive, cli, conn_args, start_user_script
from tests.support.devhost import devhost_fixture

pytestmark = pytest.mark.e2e

CLIPBOARD = "\x1b]52;c;aGVsbG8=\x1b\\"
TITLE = "\x1b]0;pwned\x07"
CSI = "\x1b[2J\x1b[6n"
C1 = "\x9b2J\x9d0;t\x9c"
# bidi override and zero-width space last
HOSTILE = f"<{CLIPBOARD}{TITLE}{CSI}{C1}\u202e\u200b>"


def unsafe(text: str) -> list[str]:
    """What a terminal would act on: C0 but tab and newline, DEL, and C1 (U+0080-U+009F); and what it
    would show invisibly (bidi and zero-width characters)."""
    return [
        c for c in text if (ord(c) < 32 and c not in "\t\n") or 0x7F <= ord(c) <= 0x9F or c in "\u202e\u200b"
    ]


def line(**rec) -> str:
    return json.dumps({"t": 1.0, **rec}) + "\n"


host = devhost_fixture(scope="module")


@pytest.fixture
def hostile_trainer(host):
    """The stand-in trainer with a hostile argument, its run dir holding hostile records, a 100k-deep line,
    a hostile log and a checkpoint directory with a hostile name."""
    folder = host.container_dir(CT)
    run = folder / "hostile-run"
    (run / "checkpoints" / f"step_1{TITLE}").mkdir(parents=True, exist_ok=True)
    (run / "metrics.jsonl").write_text(
        line(kind="step", step=HOSTILE, total_steps=9)
        + "[" * 100_000 + "]" * 100_000 + "\n"
        + line(kind="event", name="checkpoint_saved", step=5, path=f"/ck{CLIPBOARD}{C1}")
        + line(kind="step", step=7, total_steps=77, loss=0.5)
    )  # fmt: skip
    (run / "train.log").write_bytes(f"loading {CSI}{C1}\nstep 7 {TITLE} done\n".encode())
    p = start_user_script(folder, str(run), args=("--tag", HOSTILE))
    yield run, p
    p.kill()
    p.wait()


def test_status_stop_and_logs_print_the_containers_text_clean(host, hostile_trainer):
    run, p = hostile_trainer
    r = cli("status", *conn_args(host), "--run-dir", str(run))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr  # the 100k-deep line: skipped
    assert "step 7/77  loss 0.5000" in r.stdout and "/ck" in r.stdout  # the records around it: kept
    assert "--tag" in r.stdout and "\ufffd" in r.stdout, r.stdout
    assert "\\u202e\\u200b>" in r.stdout  # the invisible characters: shown as escapes
    assert not unsafe(r.stdout + r.stderr), repr(r.stdout)

    r = cli("stop", *conn_args(host), "--run-dir", str(run))  # no terminal, no --yes: the prompt, refused
    assert r.returncode == 1 and f"trainer pid {p.pid}" in r.stdout and "--tag" in r.stdout, r.stdout
    assert not unsafe(r.stdout + r.stderr), repr(r.stdout)
    assert alive(p.pid)

    r = cli("logs", *conn_args(host), "--run-dir", str(run), "-n", "5")
    assert r.returncode == 0 and r.stdout.splitlines()[-1].startswith("step 7 "), r.stdout + r.stderr
    assert not unsafe(r.stdout + r.stderr), repr(r.stdout)

    # the console knows the command line only cleaned; the helper checks it against /proc cleaned alike
    r = cli("stop", *conn_args(host), "--run-dir", str(run), "--yes", "--timeout", "30")
    assert f"SIGINT sent to pid {p.pid}" in r.stdout and "[exited]" in r.stdout, r.stdout + r.stderr
    assert p.wait(10) == 0 and not unsafe(r.stdout + r.stderr)


HEADER = {"kind": "header", "version": 1, "t": 1.0, "runs": [{"label": "r", "where": "w"}]}


def write_record(path, lines: list[str | bytes]) -> None:
    with gzip.open(path, "wb") as f:
        f.write((json.dumps(HEADER) + "\n").encode())
        for ln in lines:
            f.write(ln if isinstance(ln, bytes) else ln.encode())


def event(type_: str, data: dict, t: float = 2.0) -> str:
    return json.dumps({"kind": "event", "t": t, "run": 0, "type": type_, "data": data}) + "\n"


def test_status_and_logs_of_a_record_print_its_text_clean(tmp_path):
    rec = tmp_path / "hostile.rec"
    trainer = {"pid": 7, "start_time": 1, "cmdline": ["python3", HOSTILE], "run_dir": f"/r{TITLE}"}
    trainer["source"] = "cmdline"
    write_record(
        rec,
        [
            event("ConnState", {"state": "connected", "detail": HOSTILE}),
            event("TrainerFound", {"trainer": trainer}),
            event("Record", {"record": {"kind": "step", "t": 2.0, "step": HOSTILE, "total_steps": 9}}),
            event("LogLines", {"lines": [f"log {CLIPBOARD}{C1} end"]}),
        ],
    )  # fmt: skip
    for cmd in (["status", str(rec)], ["status", str(rec), "--json"], ["logs", str(rec)]):
        r = cli(*cmd)
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
        assert not unsafe(r.stdout + r.stderr), (cmd, r.stdout)
    assert r.stdout.strip() == "log \ufffd\ufffd\ufffd end"


def test_a_hostile_record_is_read_to_its_end_naming_each_bad_line(tmp_path):
    rec = tmp_path / "bad.rec"
    write_record(
        rec,
        [
            "[1, 2]\n",  # line 2: not an object
            event("Record", {"record": {"kind": "step"}, "extra": 1}),  # 3: an unknown field
            event("GpuSample", {"gpus": [{"index": "zero", "uuid": "u", "name": "n"}]}),  # 4: a wrong type
            event("LogLines", {"lines": "not a list"}),  # 5
            "[" * 100_000 + "]" * 100_000 + "\n",  # 6: nested too deep
            b'{"kind": "event", "t": 1, "type": "LogLines", "data": {"lines": ["' + b"x" * (17 << 20) + b'"]}}\n',
            json.dumps({"kind": "event", "t": "soon", "run": 0, "type": "LogLines", "data": {"lines": []}}) + "\n",
            event("LogLines", {"lines": ["still here"]}),  # 9: read
            '{"kind": "event", "t": 3',  # torn: the recorder was killed mid-line
        ],
    )  # fmt: skip
    r = cli("logs", str(rec))
    assert r.returncode == 0 and r.stdout == "still here\n", r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    for n in (2, 3, 4, 5, 6):
        assert f"{rec}:{n}: " in r.stderr, r.stderr
    assert "index: str is not int" in r.stderr and "longer than" not in r.stderr  # only the first five named
    assert "skipped 2 more line(s)" in r.stderr
    r = cli("status", str(rec))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr

    not_record = tmp_path / "other.gz"
    with gzip.open(not_record, "wb") as f:
        f.write(b"[" * 100_000 + b"\n")
    r = cli("status", str(not_record))
    assert r.returncode == 2 and f"{not_record}:1: not a dflash-console record" in r.stderr, r.stderr


def test_a_small_record_that_unpacks_to_a_huge_line_is_read_in_bounded_memory(tmp_path):
    """A 0.2 MB record whose one event line is 200 MB of short strings: before, reading it held the whole line
    and its decoded list (over 1 GB); now a line over 16 MB is skipped a megabyte at a time."""
    rec = tmp_path / "bomb.rec"
    with gzip.open(rec, "wb", compresslevel=9) as f:
        f.write(b'{"kind": "header", "version": 1, "t": 1.0, "runs": [{"label": "r", "where": "w"}]}\n')
        f.write(b'{"kind": "event", "t": 2.0, "run": 0, "type": "LogLines", "data": {"lines": [')
        chunk = b'"",' * (1 << 20)
        for _ in range(64):
            f.write(chunk)
        f.write(b'""]}}\n' + event("LogLines", {"lines": ["after the bomb"]}).encode())
    assert rec.stat().st_size < 400_000
    probe = (
        "import resource, subprocess, sys\n"
        "r = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, repr(r.stdout))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, *CLI, "logs", str(rec)], capture_output=True, text=True, timeout=300
    )
    rc, maxrss_kib, stdout = out.stdout.split(" ", 2)
    assert rc == "0" and "after the bomb" in stdout, out.stdout + out.stderr
    assert int(maxrss_kib) < 200 << 10, f"peak RSS {int(maxrss_kib) >> 10} MiB"


def _strict(text: str):
    """JSON as strict parsers read it: NaN, Infinity and -Infinity are not JSON."""

    def refuse(token: str):
        raise ValueError(f"not JSON: {token}")

    return json.loads(text, parse_constant=refuse)


def test_status_json_is_valid_json_when_the_records_hold_nan_and_infinity(host):
    """metrics.jsonl may hold NaN and Infinity (Python writes them; 1e999 reads as inf): ``status --json``
    prints null for them, valid JSON for any parser."""
    run = host.container_dir(CT) / "nan-run"
    run.mkdir(parents=True, exist_ok=True)
    (run / "metrics.jsonl").write_text(
        '{"t": 1.0, "kind": "step", "step": 7, "total_steps": 9, "loss": NaN, "lr": Infinity, "acc": 1e999}\n'
        '{"t": 2.0, "kind": "throughput", "tok_s": -Infinity, "devices": []}\n'
    )
    r = cli("status", *conn_args(host), "--run-dir", str(run), "--json")
    assert r.returncode in (0, 4) and "Traceback" not in r.stderr, r.stderr
    st = _strict(r.stdout)
    assert st["last_step"]["step"] == 7 and st["last_step"]["loss"] is None, st["last_step"]
    assert "NaN" not in r.stdout and "Infinity" not in r.stdout
