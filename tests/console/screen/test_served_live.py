"""Served acceptance on the screen and in ``serve-status``, end to end: a run directory in the devhost's
container with an evaluation (acceptance 3.40 at step 40), and a real HTTP server on the loopback serving
vLLM's counters; the helper reads them through the SSH connection, the panel shows the served figure, and
a drafter served well below its evaluation raises the ``served_below_eval`` alert; the CLI twin's exit codes
follow ``status --check``."""

from __future__ import annotations

import json

import pytest

from console.app import ConsoleApp
from console.core import serve_watch
from console.core.place import Proxmox
from console.core.serving import Endpoint
from console.core.session import Session
from tests.support.core_util import cli, conn_args, options_for
from tests.support.devhost import devhost_thread
from tests.support.metrics_server import MetricsServer, vllm_body
from tests.support.screen_text import screen_text, until

CT = 200
pytestmark = pytest.mark.e2e
RECORDS = [
    {"t": 1.0, "kind": "step", "step": 40, "epoch": 1.0, "loss": 1.0, "accept_len_est": 3.6, "lr": 1e-3},
    {"t": 2.0, "kind": "eval", "step": 40, "accept_len": 3.4, "per_position": [0.9, 0.7], "prompts": 8},
]


@pytest.fixture
def host(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))  # no operator's config in the way
    with devhost_thread(tmp_path / "devhost", CT) as h:
        run = h.container_dir(CT) / "run"
        run.mkdir(parents=True)
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
        yield h


async def test_the_screen_shows_served_acceptance_and_alerts_when_it_falls_below_the_evaluation(
    host, monkeypatch
):
    monkeypatch.setattr(serve_watch, "SERVE_POLL_S", 0.3)
    run_dir = host.container_dir(CT) / "run"
    with MetricsServer(vllm_body(100, 230, [90, 70, 40, 30], requests=3)) as srv:
        session = Session(
            options_for(host), place=Proxmox(CT), run_dir=str(run_dir), serve=Endpoint("vllm", srv.port)
        )
        app = ConsoleApp(session, target="devhost")
        async with app.run_test(size=(130, 40)) as pilot:
            row = lambda: f"served     3.30 vllm:{srv.port}" in screen_text(app)  # noqa: E731
            await until(pilot, row, 60, "the served figure beside the evaluation's")
            assert "3.40" in screen_text(app) and not app.state.health.alerts()  # 3% below: fine
            # a wrong drafter is served now: 200 more drafts, 60 more accepted tokens (1.30 over the window)
            srv.body = vllm_body(300, 290, [130, 80, 45, 35], requests=9)
            alerted = lambda: any(a.rule == "served_below_eval" for a in app.state.health.alerts())  # noqa: E731
            await until(pilot, alerted, 60, "the served_below_eval alert")
            alert = next(a for a in app.state.health.alerts() if a.rule == "served_below_eval")
            assert (
                "served acceptance 1.30" in alert.message and "below the evaluation's 3.40" in alert.message
            )
            assert alert.level == "critical"  # 62% below: past twice the drop, as serve-status judges it


def test_serve_status_reads_the_endpoint_through_the_helper_and_exits_as_a_check(host):
    run_dir = str(host.container_dir(CT) / "run")
    base = [*conn_args(host), "--run-dir", run_dir]
    with MetricsServer(vllm_body(100, 230, [90, 70, 40, 30])) as srv:
        r = cli("serve-status", *base, "--serve", f"vllm:{srv.port}", "--window", "0")
        assert r.returncode == 0, r.stdout + r.stderr
        assert r.stdout.startswith(f"SERVED OK: served acceptance 3.30 (vllm:{srv.port}, since the server")
        assert "evaluation 3.40 at step 40" in r.stdout and "per position: 0.90 0.70 0.40 0.30" in r.stdout
        srv.body = vllm_body(100, 100, [60, 30, 10, 0])
        r = cli("serve-status", *base, "--serve", f"vllm:{srv.port}", "--window", "0", "--json")
        out = json.loads(r.stdout)
        assert (
            r.returncode == 2 and out["served"]["accept_length"] == 2.0 and out["eval"]["accept_len"] == 3.4
        )
    r = cli("serve-status", *base, "--serve", f"vllm:{srv.port}", "--window", "0")  # nothing listens now
    assert r.returncode == 3 and r.stdout.startswith("SERVED UNKNOWN: vllm:"), r.stdout + r.stderr
    r = cli("serve-status", *base)
    assert r.returncode == 2 and "needs --serve" in r.stderr
    r = cli("serve-status", *base, "--serve", "vllm:203.0.113.5:8000")
    assert r.returncode == 2 and "loopback only" in r.stderr
