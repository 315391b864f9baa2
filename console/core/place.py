"""Where the trainer lives on an SSH host: the host itself (:class:`Host`) or a Proxmox container
(:class:`Proxmox`, ``pct exec N --``). Everything the console runs there (the helper, nvidia-smi) goes
through :meth:`Place.command`; every name of it on the screen, in the CLI's output and in errors comes
from here.

Kinds are named by a CLI flag (``--ct N``) and a config file key (``container = N`` in
``[targets.NAME]``); both are read by the one :func:`parse`. A new kind is one class here (its flag,
config key, value type, exec prefix, label and description) added to :data:`KINDS`, plus its flag in
console/cli.py.
"""

from __future__ import annotations

import shlex
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar


class PlaceError(ValueError):
    """A value that does not name a place (a config entry's or a flag's); says which key and why."""


class Place(ABC):
    """Where the trainer lives. Frozen, hashable, compared by value."""

    FLAG: ClassVar[str | None] = None  # the CLI flag that names this kind ("--ct"); None: the default
    KEY: ClassVar[str | None] = None  # its key in a [targets.NAME] entry of the config file
    JSON: ClassVar[str | None] = None  # its key in `status --json`
    TYPE: ClassVar[type] = object  # the type of the flag's / key's value

    @abstractmethod
    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` as the SSH host runs it so that it runs in this place."""

    def command(self, argv: list[str]) -> str:
        """What the SSH channel runs: :meth:`wrap` quoted with shlex.join (the only shell it meets)."""
        return shlex.join(self.wrap(list(argv)))

    @property
    @abstractmethod
    def label(self) -> str:
        """Its name beside the host's on the screen and in the CLI ("CT 200"); "" for the host."""

    @property
    @abstractmethod
    def describe(self) -> str:
        """Its name in a sentence ("container 200", "the host")."""

    @property
    @abstractmethod
    def short(self) -> str:
        """Its part of a target's default name, after the host's ("200" in "h1/200"); "" for the host."""

    @property
    @abstractmethod
    def key(self) -> tuple:
        """A stable, hashable identity (two targets of one host with the same key are one run)."""

    @abstractmethod
    def config(self) -> dict:
        """Its keys in a [targets.NAME] entry of the config file ({} for the host)."""

    @abstractmethod
    def flags(self) -> list[str]:
        """The CLI flags that name it ([] for the host)."""

    @abstractmethod
    def json(self) -> dict:
        """Its own fields in `status --json` (see :func:`to_json`)."""

    def at(self, host: str, sep: str = " · ") -> str:
        """``host`` named with it: "h1 · CT 200" (or "h1 CT 200" with ``sep=" "``), "h1" for the host."""
        return f"{host}{sep}{self.label}" if self.label else host


@dataclass(frozen=True)
class Host(Place):
    """The SSH host itself: argv runs as it is."""

    def wrap(self, argv: list[str]) -> list[str]:
        return list(argv)

    @property
    def label(self) -> str:
        return ""

    @property
    def describe(self) -> str:
        return "the host"

    @property
    def short(self) -> str:
        return ""

    @property
    def key(self) -> tuple:
        return ("host",)

    def config(self) -> dict:
        return {}

    def flags(self) -> list[str]:
        return []

    def json(self) -> dict:
        return {}


@dataclass(frozen=True)
class Proxmox(Place):
    """A Proxmox container of the host: ``pct exec CT -- argv``."""

    FLAG: ClassVar[str | None] = "--ct"
    KEY: ClassVar[str | None] = "container"
    JSON: ClassVar[str | None] = "ct"
    TYPE: ClassVar[type] = int

    ct: int

    def __post_init__(self) -> None:
        _check(str(self.KEY), self.ct, self.TYPE)

    def wrap(self, argv: list[str]) -> list[str]:
        return ["pct", "exec", str(self.ct), "--", *argv]

    @property
    def label(self) -> str:
        return f"CT {self.ct}"

    @property
    def describe(self) -> str:
        return f"container {self.ct}"

    @property
    def short(self) -> str:
        return str(self.ct)

    @property
    def key(self) -> tuple:
        return ("pct", self.ct)

    def config(self) -> dict:
        return {self.KEY: self.ct}

    def flags(self) -> list[str]:
        return [str(self.FLAG), str(self.ct)]

    def json(self) -> dict:
        return {self.JSON: self.ct}


HOST = Host()

# The kinds a flag or a config key names (Host is what none of them names).
KINDS: tuple[type[Place], ...] = (Proxmox,)
BY_NAME: dict[str, type[Place]] = {
    **{k.FLAG: k for k in KINDS if k.FLAG},
    **{k.KEY: k for k in KINDS if k.KEY},
}
CONFIG_KEYS: dict[str, type] = {k.KEY: k.TYPE for k in KINDS if k.KEY}


def _check(name: str, value: object, kind: type) -> None:
    # bool is an int to Python, never a container number to us
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise PlaceError(f"{name} must be a {kind.__name__}, not {value!r}")


def parse(name: str, value: object) -> Place:
    """The place a flag (``"--ct", 200``) or a config key (``"container", 200``) names; the one
    check of its value. :class:`PlaceError` for a wrong type (``container = "200"``, ``= true``)
    or a name that is no kind's."""
    kind = BY_NAME.get(name)
    if kind is None:
        raise PlaceError(f"{name} names no place (known: {', '.join(sorted(BY_NAME))})")
    _check(name, value, kind.TYPE)
    return kind(value)  # type: ignore[call-arg]


def from_config(entry: Mapping[str, object]) -> Place:
    """The place a [targets.NAME] entry names: its one kind key, else the host."""
    given = [k for k in entry if k in CONFIG_KEYS]
    if len(given) > 1:
        raise PlaceError(f"{' and '.join(given)} each name where the trainer lives; give one")
    return parse(given[0], entry[given[0]]) if given else HOST


def from_flags(values: Mapping[str, object]) -> list[Place]:
    """The places the CLI's flags name, in the registry's order (``values``: argparse's namespace as
    a dict; each kind's flag is ``action="append"``, so a list or None)."""
    out: list[Place] = []
    for kind in KINDS:
        if kind.FLAG:
            out += [parse(kind.FLAG, v) for v in values.get(dest(kind.FLAG)) or []]
    return out


def dest(flag: str) -> str:
    """argparse's attribute for ``flag`` ("--ct" -> "ct")."""
    return flag.lstrip("-").replace("-", "_")


def to_json(place: Place) -> dict:
    """The fields of `status --json` that say where: every kind's key (None but the place's own)."""
    return {**{k.JSON: None for k in KINDS if k.JSON}, **place.json()}


def from_json(fields: Mapping[str, object]) -> Place:
    """The place :func:`to_json` wrote (the host where no kind's key has a value)."""
    for kind in KINDS:
        if kind.JSON and fields.get(kind.JSON) is not None:
            return kind(fields[kind.JSON])  # type: ignore[call-arg]
    return HOST
