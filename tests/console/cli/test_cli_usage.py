"""What a new user trips over at the command line (issue 34, items 4, 6, 11, 12), as a real subprocess
against the in-process SSH server: the screen without a terminal, ``--ct`` with a config name, a
misspelt target, several trainers without ``--run-dir``, a record's JSON."""

from __future__ import annotations

import contextlib
import json
import os
import signal

import pytest

from console.core.events import ConnState, Record
from console.core.record import Recorder
from tests.support.core_util import CT, cli, conn_args, start_user_script
from tests.support.devhost import devhost_fixture
from tests.support.records import T0, dev, step, tp

pytestmark = pytest.mark.e2e

host = devhost_fixture(scope="module")


@pytest.fixture
def config(host, tmp_path, monkeypatch):
    """A config file naming container 200 of the devhost ``main``."""
    d = host.host
    cfg = tmp_path / "cfg" / "dflash-console"
    cfg.mkdir(parents=True)
    (cfg / "config.toml").write_text(
        f'[targets.main]\nhost = "127.0.0.1"\nport = {d.port}\nuser = "{d.user}"\n'
        f'key = "{d.client_key_path}"\nknown_hosts = "{d.known_hosts_path}"\ncontainer = {CT}\n'
        f'run_dir = "{tmp_path / "run"}"\n'
    )
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))


def test_connect_without_a_terminal_refuses_like_the_demo(host, tmp_path):
    """``connect ... </dev/null >file``: exit 2 at once, nothing written to the file (it used to draw the
    full screen into it and run on)."""
    r = cli("connect", *conn_args(host), "--run-dir", str(tmp_path), timeout=30)
    assert r.returncode == 2, r.stdout[:200] + r.stderr
    assert r.stdout == "" and "needs a terminal" in r.stderr


def test_ct_with_a_config_name_is_the_same_error_in_every_command(config):
    said = set()
    for args in (
        ("status", "main"),
        ("status", "main", "--json"),
        ("logs", "main"),
        ("stop", "main", "--yes"),
    ):
        r = cli(*args, "--ct", "201")
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        said.add(r.stderr.strip())
    assert len(said) == 1 and "--ct goes with a HOST, not a target name" in said.pop()


def test_a_misspelt_target_is_one_clear_message(config):
    r = cli("status", "mian.invalid")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr  # not the resolver's error first
    assert "'mian.invalid' is neither a target of" in lines[0] and "(main)" in lines[0]


def test_several_trainers_without_run_dir_are_listed_not_picked(host):
    folder = host.container_dir(CT)
    for name in ("a", "b"):
        (folder / name).mkdir(exist_ok=True)
    procs = [start_user_script(folder / name, str(folder / "runs" / name)) for name in ("a", "b")]
    try:
        for args in (("status",), ("status", "--json"), ("logs",), ("stop", "--yes")):
            r = cli(*args[:1], *conn_args(host), *args[1:])
            assert r.returncode == 2, (args, r.stdout, r.stderr)
            assert "say which with --run-dir" in r.stderr, r.stderr
            for p, name in zip(procs, ("a", "b"), strict=True):
                assert f"pid {p.pid}" in r.stderr and str(folder / "runs" / name) in r.stderr
        r = cli("status", *conn_args(host), "--check")  # the monitoring convention: cannot tell, UNKNOWN
        assert (
            r.returncode == 3
            and r.stdout.startswith("DFLASH UNKNOWN: cannot check: ")
            and "--run-dir" in r.stdout
        )
        assert all(p.poll() is None for p in procs)  # the stop picked none of them
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGKILL)
            p.wait(10)


def test_record_status_json_keys_are_field_names(tmp_path):
    path = tmp_path / "r.rec"
    rec = Recorder(path, [{"label": "main", "where": "127.0.0.1 · CT 200"}])
    rec.write(0, ConnState("connected"))
    rec.write(0, Record(step(T0, 7, total=70, loss=1.25)))
    rec.write(0, Record(tp(T0, [dev(0, "drafter", 450.0)], depth=5, cap=8)))
    rec.close()
    r = cli("status", str(path), "--json")
    assert r.returncode == 0, r.stderr
    row = json.loads(r.stdout)
    assert not {"#", "host / CT", "tok/s"} & set(row)
    assert all(k.isidentifier() for k in row), sorted(row)
    assert row["index"] == 1 and row["label"] == "main" and row["where"] == "127.0.0.1 · CT 200"
    assert row["tok_s"] == 450.0 and row["step"] == 7 and row["queue"] == {"depth": 5, "capacity": 8}
