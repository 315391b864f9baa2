"""What the operator screen (console/app.py) needs of a session; :class:`~console.core.session.Session`
is one. The screen depends on this, not on Session, so it can be driven by anything that speaks it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from console.core.events import ActionPhase, ActionResult, Event, TrainerInfo

if TYPE_CHECKING:
    from console.core.launching import RestartPlan


class ScreenSession(Protocol):
    readonly: bool

    def subscribe(self, callback: Callable[[Event], None]) -> Callable[[], None]:
        """Deliver every event to ``callback`` (the current ConnState at once); returns unsubscribe."""
        ...

    async def start(self) -> None: ...

    async def close(self) -> None:
        """Drop the connection; never touches the trainer."""
        ...

    async def stop_trainer(
        self, timeout: float = ..., on_phase: Callable[[ActionPhase], None] | None = ...
    ) -> ActionResult: ...

    async def restart_trainer(
        self,
        timeout: float = ...,
        on_phase: Callable[[ActionPhase], None] | None = ...,
        code_dir: str | None = ...,
        shown: RestartPlan | None = ...,
        trusted: tuple[str, ...] | list[str] = ...,
    ) -> ActionResult: ...

    async def plan_restart(
        self, code_dir: str | None = ...
    ) -> tuple[RestartPlan, list[str], TrainerInfo | None]:
        """What a restart would launch, why it needs its own confirmation, the trainer it stops first."""
        ...

    async def prefill_concerns(
        self, python: str | None, code_dir: str | None, run: dict | None = ...
    ) -> list[str]:
        """Why the launch dialog's run.json values need a typed ``trust``."""
        ...

    async def launch(
        self,
        flags: list[str],
        python: str = ...,
        code_dir: str | None = ...,
        on_status: Callable[[str], None] | None = ...,
    ) -> ActionResult: ...

    async def deploy(self) -> str:
        """Copy the bundled trainer into a new code dir on the host; returns that dir."""
        ...
