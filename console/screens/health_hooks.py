"""What the screen does with the health rules (console/core/health.py): evaluate them on a short
timer, and when an alert starts or gets worse say so: a line in the events, a toast, the terminal
bell, and (off by default) a desktop notification through the terminal's escape sequence
(OSC 777 and OSC 9, which terminals that do not know them ignore). An acknowledged alert stays silent
until it clears. Also polls the run directory's checkpoints and free space (console/core/checkpoints.py)
while a real session is connected."""

from __future__ import annotations

from console.core.checkpoints import CheckpointWatch
from console.core.health import NOTE, HealthConfig


def osc_notify(title: str, body: str) -> str:
    clean = [s.replace("\x1b", "").replace("\x07", "").replace(";", ",") for s in (title, body)]
    return f"\x1b]777;notify;{clean[0]};{clean[1]}\x1b\\\x1b]9;{clean[0]}: {clean[1]}\x1b\\"


class HealthHooks:
    def __init__(
        self,
        config: HealthConfig | None = None,
        bundled_key: str | None = None,
        interval_s: float = 0.1,
        disk_interval_s: float = 30.0,
    ) -> None:
        self.config = config
        self.bundled_key = bundled_key
        self.interval_s = interval_s
        self.disk_interval_s = disk_interval_s
        self.app = None
        self.watch: CheckpointWatch | None = None
        self.rang = 0  # bells rung (tests)
        self.desktop_sent: list[str] = []

    def mount(self, app) -> None:
        self.app = app
        health = app.state.health
        if self.config is not None:
            health.config = self.config
        if self.bundled_key is not None:
            health.bundled_key = self.bundled_key
        app.set_interval(self.interval_s, self.tick)
        session = app.session
        if session is not None and hasattr(session, "need_helper"):
            self.watch = CheckpointWatch(session, self._disk, self.disk_interval_s)
            self.watch.start()

    async def unmount(self) -> None:
        if self.watch is not None:
            await self.watch.stop()

    def _disk(self, info) -> None:
        self.app.on_session_event(info)

    def tick(self) -> None:
        app = self.app
        st = app.state
        changes = st.health.evaluate()
        if not changes:
            return
        cfg = st.health.config
        for ch in changes:
            a = ch.alert
            if ch.kind == "cleared":
                st.note(f"alert cleared: {a.message}")
                continue
            if ch.kind == "started":
                st.note(f"alert {a.level}: {a.message}", "info" if a.level == NOTE else "error")
            else:
                st.note(f"alert now {a.level}: {a.message}", "error")
            if a.level == NOTE or a.acked:
                continue
            app.notify(
                a.message,
                title=f"{a.level.upper()} (a: alerts)",
                severity="error" if a.level == "critical" else "warning",
                timeout=30 if a.level == "critical" else 15,
            )
            if cfg.bell:
                self.rang += 1
                app.bell()
            if cfg.desktop:
                seq = osc_notify(f"dflash-console {a.level}", a.message)
                self.desktop_sent.append(seq)
                driver = getattr(app, "_driver", None)
                if driver is not None:
                    driver.write(seq)
                    driver.flush()
        app.schedule_refresh()
