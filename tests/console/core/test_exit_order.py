"""A trainer's exit reaches the session's subscribers only after its last metrics.jsonl records
(Session._trainer_exited drains the follower first), so health needs no grace wait: a stand-in that
writes `stopped` (finished) and exits at once never rings `trainer_exit`. The SIGKILL case (the alert
within a second) is tests/console/screen/test_health_live.py."""

from __future__ import annotations

import asyncio

import pytest

from console.core.events import Record, TrainerFound
from console.core.health import Health
from console.core.place import Proxmox
from console.core.session import Session
from tests.support.core_util import CT, options_for
from tests.support.devhost import devhost_fixture
from tests.support.standin import start_contract_trainer

pytestmark = pytest.mark.e2e

host = devhost_fixture(asynchronous=True)


async def _until(pred, timeout: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not pred():
        assert loop.time() < end, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("attempt", range(5))
async def test_a_clean_finish_that_exits_at_once_never_rings_trainer_exit(host, tmp_path, attempt):
    folder = host.container_dir(CT)
    run_dir, release = folder / "run", tmp_path / "release"
    p = start_contract_trainer(folder, run_dir, STANDIN_MODE="finish", STANDIN_RELEASE=str(release))
    health = Health()
    seen: list[object] = []
    raised: list[str] = []

    def on_event(ev: object) -> None:
        if isinstance(ev, (Record, TrainerFound)):
            seen.append(ev)
            health.apply(ev)
            raised.extend(ch.alert.key for ch in health.evaluate() if ch.kind == "started")

    try:
        async with Session(options_for(host), place=Proxmox(CT), run_dir=str(run_dir), telemetry=False) as s:
            s.subscribe(on_event)
            await _until(lambda: s.trainer is not None and health.f.started, 30, "the trainer and `started`")
            release.touch()
            await _until(
                lambda: seen and isinstance(seen[-1], TrainerFound) and seen[-1].trainer is None,
                30,
                "the exit",
            )
    finally:
        if p.poll() is None:
            p.kill()
        p.wait(10)
    assert p.returncode == 0, p.stdout.read()
    assert raised == [], raised
    # every record the trainer wrote came before the exit: the last step, then `stopped`, then the exit
    exit_at = max(i for i, ev in enumerate(seen) if isinstance(ev, TrainerFound) and ev.trainer is None)
    recs = [ev.record for ev in seen[:exit_at] if isinstance(ev, Record)]
    assert [r.get("step") for r in recs if r.get("kind") == "step"] == [6, 7, 8]
    assert recs[-1].get("name") == "stopped" and recs[-1].get("reason") == "finished"
    assert health.alerts() == []
