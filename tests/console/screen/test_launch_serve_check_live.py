"""The launch dialog's train/serve check: it says up front what the launch will be checked against, or why
the check is skipped; against the in-process SSH server and the real tiny trainer, a failing check keeps the
dialog open with its lines and starts nothing, and ``serve`` typed in the field that appears launches."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sys

import pytest
from textual.widgets import Input

from console.app import ConsoleApp
from console.core.events import ActionResult, ConnState
from console.core.place import Proxmox
from console.core.serve_check import ServeCheck
from console.core.serving import Endpoint
from console.core.session import Session
from console.screens.launch_dialog import LaunchDialog
from tests.console.screen.test_dialog_fit import Connected, _app, _words
from tests.console.screen.test_dialog_flow import FakeSession
from tests.console.screen.test_dialog_flow import _app as _flow_app
from tests.support.core_util import options_for
from tests.support.devhost import devhost_fixture
from tests.support.screen_text import screen_text, until
from tests.support.trainer_run import ROOT, TRAINER_ENV, tiny_flags

CT = 200
SIZE = (130, 40)

host = devhost_fixture(CT, env=TRAINER_ENV)


class Served(Connected):
    serve = Endpoint("sglang", 30000, thinking="off")


async def test_the_dialog_says_what_the_check_compares_or_why_it_is_skipped():
    for session, said in (
        (Connected(), "train/serve check: skipped: the target names no serving"),
        (Served(), "train/serve check before launching: the flags against sglang:30000 (thinking off)"),
    ):
        app = _app()
        async with app.run_test(size=SIZE) as pilot:
            app.session = session
            await pilot.press("l")
            assert isinstance(app.screen, LaunchDialog)
            await pilot.pause(0.1)
            assert said in _words(screen_text(app)), screen_text(app)


WARNED = ServeCheck(
    "ok",
    "vllm:8000 (thinking off): ok, 1 warning",
    warnings=("vllm: warning: layer_types: mixed sliding and full layers: VLLM_USE_V2_MODEL_RUNNER=1",),
)


class WarnedSession(FakeSession):
    async def launch(self, flags, python="python3", code_dir=None, on_status=None, **kw):
        res = await super().launch(flags, python, code_dir, on_status, **kw)
        return ActionResult(
            res.code, f"{res.message}; serve check {WARNED.summary}", res.trainer, serve_check=WARNED
        )


async def test_warnings_of_the_check_are_said_and_do_not_block():
    app = _flow_app(WarnedSession())
    async with app.run_test(size=SIZE) as pilot:
        app.feed([ConnState("connected")])
        await pilot.press("l")
        app.screen.query_one("#flags").value = "--target-model /m --output-dir /runs/a"
        await pilot.click("#launch")
        await until(pilot, lambda: not isinstance(app.screen, LaunchDialog), 5, "the dialog to close")
        said = [(e.text, e.level) for e in app.state.events]
        assert said == [
            (
                "launched pid 14338 in /runs/a (code /opt/code); serve check vllm:8000 (thinking off): ok, 1 warning",
                "info",
            ),
            (f"serve check: {WARNED.warnings[0]}", "warn"),
        ], said


@pytest.mark.e2e
async def test_a_failing_check_keeps_the_dialog_open_until_serve_is_typed(host, tiny_assets):
    run_dir = host.container_dir(CT) / "run"
    serve = Endpoint("vllm", 8000, thinking="on")
    session = Session(
        options_for(host), place=Proxmox(CT), run_dir=str(run_dir), telemetry=False, serve=serve
    )
    app = ConsoleApp(session, target="devhost")
    pid = None
    try:
        async with app.run_test(size=SIZE) as pilot:
            await until(
                pilot,
                lambda: app.state.trainer_known and app.state.conn.state == "connected",
                30,
                "connected",
            )
            await pilot.press("l")
            dlg = app.screen
            assert isinstance(dlg, LaunchDialog)
            dlg.query_one("#flags").value = shlex.join(tiny_flags(tiny_assets, run_dir, "--epochs", "1000"))
            dlg.query_one("#python").value = sys.executable
            dlg.query_one("#code_dir").value = str(ROOT)
            await pilot.pause()
            await pilot.click("#launch")
            await until(pilot, lambda: dlg.query("#serve_ok") and not dlg.busy, 240, "the check's refusal")
            text = _words(screen_text(app))
            assert (
                app.screen is dlg and "the train/serve check fails: vllm:8000 (thinking on): 1 error" in text
            )
            assert "vllm: error: thinking: the data trains no thinking" in text, text
            assert 'type "serve" above and press Enter to launch anyway' in text
            assert not (run_dir / "run.json").exists() and app.state.trainer is None  # nothing started
            box = dlg.query_one("#serve_ok", Input)
            box.focus()
            box.value = "serve"
            await pilot.press("enter")
            await until(pilot, lambda: not isinstance(app.screen, LaunchDialog), 240, "the launch")
            pid = app.state.trainer.pid if app.state.trainer is not None else None
            launched = [e.text for e in app.state.events if e.text.startswith("launched pid ")]
            assert len(launched) == 1 and "serve check vllm:8000 (thinking on): 1 error" in launched[0], (
                launched
            )
            assert (run_dir / "run.json").exists()
    finally:
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
