"""The log pane under a flood, live: a writer appends 100k lines a second to train.log in the devhost's
container for a few seconds, then one END line; the screen, following, shows the END line soon after
it is written (it showed a line many seconds old, and said "following", before the pane's fix)."""

from __future__ import annotations

import asyncio
import sys
import time

import pytest

from console.app import ConsoleApp
from console.core.place import Proxmox
from console.core.session import Session
from tests.support.core_util import CT, options_for
from tests.support.devhost import devhost_fixture
from tests.support.screen_text import screen_text, until

pytestmark = pytest.mark.e2e

host = devhost_fixture(asynchronous=True)

RATE, SECONDS = 100_000, 3.0
WRITER = r"""
import sys, time
rate, secs = int(sys.argv[2]), float(sys.argv[3])
with open(sys.argv[1], "a", buffering=1 << 20) as f:
    t0, n = time.monotonic(), 0
    while time.monotonic() - t0 < secs:
        f.write("".join(f"flood line {n + i}\n" for i in range(1000)))
        f.flush()
        n += 1000
        ahead = n / rate - (time.monotonic() - t0)
        if ahead > 0:
            time.sleep(ahead)
    f.write("END of the flood\n")
print(n, flush=True)
"""


async def test_the_pane_shows_the_end_of_a_flood(host):
    run = host.container_dir(CT) / "run"
    run.mkdir(parents=True)
    (run / "train.log").write_text("start of the log\n")
    session = Session(options_for(host), place=Proxmox(CT), run_dir=str(run), telemetry=False)
    app = ConsoleApp(session, target="devhost")
    async with app.run_test(size=(120, 36)) as pilot:
        log = app.log_view
        await until(pilot, lambda: "start of the log" in log.lines, 60, "the log followed")
        writer = await asyncio.create_subprocess_exec(
            sys.executable, "-c", WRITER, str(run / "train.log"), str(RATE), str(SECONDS),
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        written = int((await writer.stdout.read()).split()[0])
        assert await writer.wait() == 0 and written >= RATE  # a flood indeed
        t_end = time.monotonic()
        await until(pilot, lambda: "END of the flood" in screen_text(app), 60, "the END line on screen")
        lag = time.monotonic() - t_end
        assert log.auto_scroll and "following" in screen_text(app)
        assert log.lines[-1] == "END of the flood" and log.received > written // 2, (log.received, lag)
