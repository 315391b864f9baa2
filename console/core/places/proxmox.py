"""A Proxmox container of the host: ``pct exec CT -- argv`` (``--ct N``, ``container = N``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from console.core.places.base import Runtime


@dataclass(frozen=True)
class Proxmox(Runtime):
    FLAG: ClassVar[str | None] = "--ct"
    KEY: ClassVar[str | None] = "container"
    JSON: ClassVar[str | None] = "ct"
    TYPE: ClassVar[type] = int
    TOOL: ClassVar[str] = "pct"
    LABEL: ClassVar[str] = "CT"
    NOUN: ClassVar[str] = "container"
    METAVAR: ClassVar[str] = "N"
    HELP: ClassVar[str] = "Proxmox container: run everything via `pct exec N --`"

    ct: int

    def __post_init__(self) -> None:
        self.check()

    @property
    def value(self) -> int:
        return self.ct

    @property
    def short(self) -> str:
        return str(self.ct)

    @property
    def key(self) -> tuple:
        return ("pct", self.ct)

    def wrap(self, argv: list[str]) -> list[str]:
        return ["pct", "exec", str(self.ct), "--", *argv]
