"""A plain LXC container of the host: ``lxc-attach -n NAME [-P LXCPATH] -- argv`` (``--lxc [LXCPATH/]NAME``,
``lxc = "..."``). What ``pct exec`` runs on a Proxmox host, without Proxmox."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import ClassVar

from console.core.places.base import PlaceError, Runtime, check_name


@dataclass(frozen=True)
class Lxc(Runtime):
    FLAG: ClassVar[str | None] = "--lxc"
    KEY: ClassVar[str | None] = "lxc"
    JSON: ClassVar[str | None] = "lxc"
    TYPE: ClassVar[type] = str
    TOOL: ClassVar[str] = "lxc-attach"
    LABEL: ClassVar[str] = "LXC"
    NOUN: ClassVar[str] = "LXC container"
    METAVAR: ClassVar[str] = "[LXCPATH/]NAME"
    HELP: ClassVar[str] = "LXC container: run everything via `lxc-attach -n NAME [-P LXCPATH] --`"

    name: str

    def __post_init__(self) -> None:
        self.check()
        path, name = self.parts
        check_name(str(self.KEY), "container", name)
        if path and not posixpath.isabs(path):
            raise PlaceError(f"{self.KEY}: the LXC path {path!r} must be absolute")

    @property
    def value(self) -> str:
        return self.name

    @property
    def short(self) -> str:
        return f"{self.KEY}:{self.parts[1]}"

    @property
    def parts(self) -> tuple[str, str]:
        """(lxcpath or "", container name): the value split at its last "/"."""
        path, _, name = self.name.rpartition("/")
        return path, name

    def wrap(self, argv: list[str]) -> list[str]:
        path, name = self.parts
        return ["lxc-attach", "-n", name, *(["-P", path] if path else []), "--", *argv]
