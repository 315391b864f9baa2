"""The launcher's control socket authenticates every connection (issue 33, item 3).

A forged client on the socket of a real launcher run (the tiny trainer, ``--launch multi``: one target and
one drafter worker) sends what the protocol would obey: a ``hello`` claiming rank 1, a forged
``checkpoint_saved`` record and a ``fatal`` (which aborts the run). It is dropped before any of it is read:
the record never reaches metrics.jsonl, the run is not aborted and finishes, and the drop is logged once.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from tests.support.trainer_run import Trainer, events, records, tiny_flags, wait_for_step
from trainer.runtime import control_channel

FORGED = [
    {"op": "hello", "rank": 1, "role": "drafter", "index": 0, "device": "cpu", "uuid": None, "pid": 1},
    {
        "op": "record",
        "kind": "event",
        "fields": {"name": "checkpoint_saved", "step": 999, "path": "/forged", "seconds": 0, "bytes": 1},
    },
    {"op": "fatal", "code": 1, "message": "forged fatal"},
]


def _forge(port: int, answer_challenge: bool) -> bytes:
    """Connect, send the forged messages (after a wrong answer to the challenge, if asked), read what
    comes back until the launcher closes the connection."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    got = b""
    try:
        if answer_challenge:
            got += s.recv(4096)  # the challenge
            s.sendall(b'{"op": "auth", "mac": "00", "nonce": "ab"}\n')
        s.sendall(b"".join(json.dumps(m).encode() + b"\n" for m in FORGED))
        while chunk := s.recv(4096):
            got += chunk
    except OSError:
        pass
    finally:
        s.close()
    return got


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_right_secret_connects_and_a_wrong_one_is_dropped_and_logged():
    logged: list[str] = []
    server = control_channel.Server(secret="s3cret", log=logged.append)
    try:
        ch = control_channel.connect(f"127.0.0.1:{server.port}", "s3cret", timeout=10)
        ch.send("hello", rank=0)
        cid, msg = server.inbox.get(timeout=10)
        assert msg == {"op": "hello", "rank": 0}
        with pytest.raises(control_channel.AuthError, match="another secret"):
            control_channel.connect(f"127.0.0.1:{server.port}", "wrong", timeout=10)
        end = time.monotonic() + 10
        while not logged and time.monotonic() < end:
            time.sleep(0.02)
        assert len(logged) == 1 and "did not authenticate" in logged[0] and "wrong answer" in logged[0]
        assert server.inbox.empty() and list(server.channels) == [cid]
        ch.close()
    finally:
        server.close()


def test_a_silent_peer_holds_up_no_worker_and_is_dropped_after_the_timeout(monkeypatch):
    monkeypatch.setattr(control_channel, "AUTH_TIMEOUT_S", 1.0)
    logged: list[str] = []
    server = control_channel.Server(secret="k", log=logged.append)
    silent = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    try:
        ch = control_channel.connect(f"127.0.0.1:{server.port}", "k", timeout=10)  # beside the silent one
        ch.send("hello", rank=0)
        assert server.inbox.get(timeout=10)[1] == {"op": "hello", "rank": 0}
        end = time.monotonic() + 30
        while not logged and time.monotonic() < end:
            time.sleep(0.05)
        assert len(logged) == 1 and "no answer" in logged[0], logged
        assert silent.recv(4096).startswith(b'{"op": "challenge"') and silent.recv(4096) == b""  # closed
        ch.close()
    finally:
        silent.close()
        server.close()


def _trickler(port: int, stop: threading.Event) -> threading.Thread:
    """A peer that sends one byte of a never-ending line every 0.2 s (each read is quick; the line never ends)."""

    def run():
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
        except OSError:
            return
        try:
            while not stop.wait(0.2):
                s.sendall(b"x")
        except OSError:
            pass
        finally:
            s.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_a_trickling_peer_is_dropped_at_the_deadline_over_all_its_bytes(monkeypatch):
    monkeypatch.setattr(control_channel, "AUTH_TIMEOUT_S", 1.0)
    logged: list[str] = []
    server = control_channel.Server(secret="k", log=logged.append)
    stop = threading.Event()
    try:
        t0 = time.monotonic()
        _trickler(server.port, stop)
        while not logged and time.monotonic() - t0 < 60:
            time.sleep(0.05)
        assert len(logged) == 1 and "did not authenticate" in logged[0], logged
        assert time.monotonic() - t0 < 15  # 1 s and the close; not the 4096-byte line's 14 minutes
    finally:
        stop.set()
        server.close()


def test_peers_holding_every_handshake_slot_starve_no_worker(monkeypatch):
    """66 peers connected as soon as the port is there, each trickling: a worker connecting after them still
    gets through (the oldest pending handshakes make room; it answers at once), well before their deadline."""
    monkeypatch.setattr(control_channel, "AUTH_TIMEOUT_S", 60.0)
    server = control_channel.Server(secret="k", log=lambda msg: None)
    stop = threading.Event()
    try:
        peers = [_trickler(server.port, stop) for _ in range(control_channel.HANDSHAKES_MAX + 2)]
        end = time.monotonic() + 30
        while len(server._pending) < control_channel.PER_SOURCE_MAX and time.monotonic() < end:
            time.sleep(0.05)  # the slots of 127.0.0.1 are held
        t0 = time.monotonic()
        ch = control_channel.connect(f"127.0.0.1:{server.port}", "k", timeout=30)
        assert time.monotonic() - t0 < 30  # not after the peers' 60 s deadline
        ch.send("hello", rank=0)
        assert server.inbox.get(timeout=10)[1] == {"op": "hello", "rank": 0}
        ch.close()
    finally:
        stop.set()
        server.close()
        for p in peers:
            p.join(10)


def test_the_rendezvous_store_listens_on_loopback_only():
    from datetime import timedelta

    from torch.distributed import TCPStore

    from trainer.runtime.launcher import local_store

    store = local_store(TCPStore, timedelta(seconds=30))
    try:
        port = store.port
        listening = []
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with open(table) as f:
                for line in f.read().splitlines()[1:]:
                    local, state = line.split()[1], line.split()[3]
                    if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                        listening.append(local.rsplit(":", 1)[0])
        assert listening == ["0100007F"], listening  # 127.0.0.1, and no other interface (nor :: in tcp6)
        client = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
        client.set("a", "b")
        assert store.get("a") == b"b"
    finally:
        del store


def test_a_worker_without_a_secret_is_told_where_to_find_one(tmp_path, monkeypatch):
    monkeypatch.delenv(control_channel.SECRET_ENV, raising=False)
    with pytest.raises(control_channel.AuthError, match="control.secret"):
        control_channel.worker_secret(str(tmp_path))
    path = control_channel.write_secret_file(str(tmp_path), "abc")
    assert (tmp_path / "control.secret").stat().st_mode & 0o777 == 0o600
    assert control_channel.worker_secret(str(tmp_path)) == "abc" and path.endswith("control.secret")


@pytest.mark.e2e
def test_a_forged_client_is_dropped_and_the_run_goes_on(tiny_assets, tmp_path):
    out, port = tmp_path / "run", _free_port()
    flags = tiny_flags(tiny_assets, out, "--launch", "multi", "--max-steps", "6", "--control-port", str(port))
    t = Trainer(flags)
    try:
        t.wait_line("launched ", timeout=120)
        raw = _forge(port, answer_challenge=False)  # the old protocol's first message: a hello
        answered = _forge(port, answer_challenge=True)  # a wrong answer to the challenge
        assert b"welcome" not in raw + answered and b"authok" not in answered
        wait_for_step(out, 1, t, timeout=180)
        assert t.wait(180) == 0, t.output
    finally:
        t.kill()
    saved = [e for e in events(out) if e["name"] == "checkpoint_saved"]
    assert [e["step"] for e in saved] == [6] and saved[0]["path"] != "/forged", saved
    assert not [e for e in events(out) if e["name"] == "error"], t.output
    assert [r["step"] for r in records(out) if r["kind"] == "step"] == [1, 2, 3, 4, 5, 6]
    dropped = [ln for ln in t.lines if "control socket: dropped a connection" in ln]
    assert len(dropped) == 2, t.output  # once each
    assert "forged fatal" not in t.output and not (out / "control.secret").exists()
