"""Pilot-test helpers: what the terminal shows, as text, and waiting for a condition on screen."""

import time


def screen_text(app) -> str:
    """The current screen's composited lines."""
    strips = app.screen._compositor.render_strips()
    return "\n".join(s.text.rstrip() for s in strips)


async def until(pilot, cond, timeout: float, what: str) -> None:
    """Let the app run until ``cond()`` holds; fail with the screen's text after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        await pilot.pause(0.1)
    raise AssertionError(f"timed out waiting for {what}:\n{screen_text(pilot.app)}")
