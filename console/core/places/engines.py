"""A Docker or Podman container of the host: ``docker|podman [--context C] exec -i [-u USER] NAME argv``
(``--docker [USER@][CONTEXT/]NAME``, ``--podman ...``). The CLI on the SSH host finds its daemon as it
always does (DOCKER_HOST, CONTAINER_HOST, its contexts, containers.conf)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from console.core.places.base import Runtime, check_name


@dataclass(frozen=True)
class _Engine(Runtime):
    TYPE: ClassVar[type] = str
    METAVAR: ClassVar[str] = "[USER@][CONTEXT/]NAME"
    CONTEXT_FLAG: ClassVar[str] = "--context"

    name: str

    def __post_init__(self) -> None:
        self.check()
        user, context, name = self.parts
        check_name(str(self.KEY), "container", name)
        if user:
            check_name(str(self.KEY), "user", user)
        if context:
            check_name(str(self.KEY), "context", context)

    @property
    def value(self) -> str:
        return self.name

    @property
    def parts(self) -> tuple[str, str, str]:
        """(user or "", context or "", container name)."""
        user, _, rest = self.name.rpartition("@")
        context, _, name = rest.rpartition("/")
        return user, context, name

    def wrap(self, argv: list[str]) -> list[str]:
        user, context, name = self.parts
        pre = [self.TOOL, *([self.CONTEXT_FLAG, context] if context else []), "exec", "-i"]
        return [*pre, *(["-u", user] if user else []), name, *argv]


@dataclass(frozen=True)
class Docker(_Engine):
    FLAG: ClassVar[str | None] = "--docker"
    KEY: ClassVar[str | None] = "docker"
    JSON: ClassVar[str | None] = "docker"
    TOOL: ClassVar[str] = "docker"
    LABEL: ClassVar[str] = "docker"
    NOUN: ClassVar[str] = "Docker container"
    HELP: ClassVar[str] = "Docker container: run everything via `docker [--context C] exec -i [-u USER] NAME`"


@dataclass(frozen=True)
class Podman(_Engine):
    FLAG: ClassVar[str | None] = "--podman"
    KEY: ClassVar[str | None] = "podman"
    JSON: ClassVar[str | None] = "podman"
    TOOL: ClassVar[str] = "podman"
    LABEL: ClassVar[str] = "podman"
    NOUN: ClassVar[str] = "Podman container"
    CONTEXT_FLAG: ClassVar[str] = "--connection"
    HELP: ClassVar[str] = (
        "Podman container: run everything via `podman [--connection C] exec -i [-u USER] NAME`"
    )
