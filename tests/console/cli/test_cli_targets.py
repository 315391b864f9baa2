"""The one-run commands (stop, restart, launch, deploy, logs, status --check) with a name of the
config file's ``[targets]``, as a real subprocess against the in-process SSH server; the trainers are
the stand-in for a user's script (tests/support/core_util.py: runs until SIGINT, saves, exits 0)."""

from __future__ import annotations

import contextlib
import os
import signal

import pytest

from tests.support.core_util import alive, cli, start_user_script
from tests.support.devhost import devhost_thread

pytestmark = pytest.mark.e2e


@pytest.fixture
def named(tmp_path, monkeypatch):
    """Containers 200 (target ``main``) and 201 (target ``ro``, read-only) of one devhost, each with a
    stand-in trainer (no metrics.jsonl: found by its command line) and a train.log; the config file names both."""
    procs = {}
    with devhost_thread(tmp_path / "dh", 200, 201) as h:
        entries = []
        for ct, name, extra in ((200, "main", ""), (201, "ro", "readonly = true\n")):
            run_dir = h.container_dir(ct) / "run"
            run_dir.mkdir()
            (run_dir / "train.log").write_text("".join(f"{name} line {i}\n" for i in range(1, 8)))
            procs[name] = start_user_script(h.container_dir(ct), str(run_dir))
            d = h.host
            entries.append(
                f'[targets.{name}]\nhost = "127.0.0.1"\nport = {d.port}\nuser = "{d.user}"\n'
                f'key = "{d.client_key_path}"\nknown_hosts = "{d.known_hosts_path}"\n'
                f'container = {ct}\nrun_dir = "{run_dir}"\n{extra}'
            )
        cfg = tmp_path / "cfg" / "dflash-console"
        cfg.mkdir(parents=True)
        (cfg / "config.toml").write_text("\n".join(entries))
        monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
        try:
            yield procs
        finally:
            for p in procs.values():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGKILL)
                p.wait(10)


def test_logs_check_and_stop_by_name(named):
    r = cli("logs", "main", "-n", "3")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["main line 5", "main line 6", "main line 7"]

    r = cli("status", "main", "--check")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith(f"DFLASH OK: trainer PID {named['main'].pid} running"), r.stdout

    r = cli("stop", "main", "--yes", "--timeout", "60")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"trainer pid {named['main'].pid}" in r.stdout and "[exited]" in r.stdout
    assert named["main"].wait(10) == 0  # got SIGINT, saved and exited
    assert alive(named["ro"].pid)  # the other container's run is untouched


def test_readonly_target_refuses_changes_and_still_reads(named):
    for args in (
        ("stop", "ro", "--yes"),
        ("restart", "ro", "--yes"),
        ("deploy", "ro"),
        ("launch", "ro", "--", "--output-dir", "x"),
    ):
        r = cli(*args)
        assert r.returncode == 7, (args, r.stdout, r.stderr)
        assert "read-only" in r.stderr and f"{args[0]} refused" in r.stderr
    assert alive(named["ro"].pid)
    r = cli("logs", "ro", "-n", "1")
    assert r.returncode == 0 and r.stdout == "ro line 7\n", r.stderr


def test_unknown_name_and_several_runs_are_usage_errors(named):
    r = cli("logs", "no-such-run.invalid", "-n", "3")
    assert r.returncode == 2, r.stderr
    assert "neither a target of" in r.stderr and "(main, ro)" in r.stderr
    r = cli("status", "no-such-run.invalid", "--check")  # the monitoring convention: UNKNOWN
    assert r.returncode == 3 and r.stdout.startswith("DFLASH UNKNOWN: cannot check"), r.stdout
    r = cli("stop", "main", "ro", "--yes")  # two names
    assert r.returncode == 2 and "acts on one run" in r.stderr
    r = cli("stop", "127.0.0.1", "--ct", "200", "--ct", "201", "--yes")  # a HOST naming two runs
    assert r.returncode == 2 and "names 2 runs" in r.stderr
    r = cli("stop", "main", "--ct", "201", "--yes")  # a name fixes its container
    assert r.returncode == 2 and "--ct goes with a HOST" in r.stderr
    r = cli("status", "main", "ro", "--check")
    assert r.returncode == 2 and "--check takes one run" in r.stderr
    assert alive(named["main"].pid) and alive(named["ro"].pid)


def _config(tmp_path, monkeypatch, text: str) -> None:
    cfg = tmp_path / "cfg" / "dflash-console"
    cfg.mkdir(parents=True, exist_ok=True)
    (cfg / "config.toml").write_text(text)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))


def test_a_deeply_nested_config_is_one_line_and_labels_are_shown_clean(tmp_path, monkeypatch):
    """A config.toml nested 5000 deep is one line naming the file (no RecursionError traceback); a
    target's label holding escapes and a bidi override is shown cleaned."""
    _config(tmp_path, monkeypatch, "x = " + "[" * 5000 + "]" * 5000 + "\n")
    r = cli("status", "main")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1 and "config.toml: nested deeper than" in r.stderr, r.stderr

    hostile = "\\u001b]0;pwned\\u0007main\\u202erun\\u001b[2J"
    unreachable = 'host = "127.0.0.1"\nport = 1\n'
    _config(
        tmp_path,
        monkeypatch,
        f'[targets.a]\n{unreachable}label = "{hostile}"\n[targets.b]\n{unreachable}run_dir = "/b"\n',
    )
    r = cli("status", "a", "b")
    out = r.stdout + r.stderr
    assert "main\\u202erun" in r.stdout, out  # the label, its bidi override shown as an escape
    assert not [
        c for c in out if (ord(c) < 32 and c not in "\t\n") or 0x7F <= ord(c) <= 0x9F or c == "\u202e"
    ]
