"""What every place is (:class:`Place`), the host itself (:class:`Host`), and the base of the places a flag
names (:class:`Runtime`: a Proxmox container, an LXC or Docker or Podman container, a pod, a Slurm job).

A runtime is one file of this package: its flag, config key, value type and syntax, exec prefix, label and
help. console/core/place.py lists them (``KINDS``) and parses flags and config entries into them.
"""

from __future__ import annotations

import re
import shlex
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar


class PlaceError(ValueError):
    """A value that does not name a place (a config entry's or a flag's); says which key and why."""


# A container, pod, job or user name as the runtimes allow them: never empty, never an option ("-x").
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,252}")


def check_name(key: str, what: str, value: str) -> str:
    """``value`` when it is a name (:data:`NAME`), else :class:`PlaceError` saying which key and part."""
    if not NAME.fullmatch(value):
        raise PlaceError(f"{key}: {what} {value!r} is not a name (letters, digits, '_', '.', '-')")
    return value


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
        """Its own fields in `status --json` (see console/core/place.py ``to_json``)."""

    # A scheduler (a Slurm job): its submit command ("sbatch"), else None; the methods below are its.
    SCHEDULER: ClassVar[str | None] = None
    NOUN: ClassVar[str] = ""  # the kind in a sentence ("Slurm job" in "submitted Slurm job 12")

    def check_launch(self) -> None:
        """:class:`PlaceError` when a launch cannot go here (a Slurm job named by id: a launch makes a new
        one); said before anything is done."""
        return None

    def submit(self, argv: list[str], *, log: str, cwd: str) -> list[str] | None:
        """The command that hands ``argv`` (the trainer's) to a scheduler, run where the helper runs; None
        where the helper starts the trainer itself (every place but a Slurm job)."""
        return None

    def submitted(self, stdout: str) -> str | None:
        """The job id in :meth:`submit`'s output, None when it names none."""
        return None

    def job_argv(self, job: str) -> list[str]:
        """A command whose output :meth:`state` reads, for the one job ``job``."""
        raise NotImplementedError(f"{type(self).__name__} has no scheduler")

    def ended(self, state: dict | None) -> bool:
        """Whether the job :meth:`state` read has ended (None: the scheduler no longer shows it)."""
        return True

    def state_argv(self) -> list[str] | None:
        """A command (run where the helper runs) that tells the place's scheduler state; None where there is
        no scheduler (every place but a Slurm job). :meth:`state` reads its output."""
        return None

    def state(self, stdout: str) -> dict | None:
        """The scheduler's state from :meth:`state_argv`'s output (a Slurm job's id, state, reason, time
        used and left, nodes), None when it shows none."""
        return None

    def run_dir(self, state: dict | None) -> str | None:
        """The run dir the scheduler's :meth:`state` names (a Slurm job's output file), else None."""
        return None

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


HOST = Host()


def check_type(name: str, value: object, kind: type) -> None:
    # bool is an int to Python, never a container number to us
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise PlaceError(f"{name} must be a {kind.__name__}, not {value!r}")


class Runtime(Place):
    """A place a flag names: one value (a container number, a name), an exec prefix on the SSH host.

    A subclass sets the class attributes below, holds its value in one dataclass field, checks it in
    ``__post_init__`` (:meth:`check`) and writes :meth:`wrap`.
    """

    TOOL: ClassVar[str] = ""  # the program on the SSH host that reaches it ("pct", "docker")
    LABEL: ClassVar[str] = ""  # its label's word ("CT" in "CT 200")
    METAVAR: ClassVar[str] = "NAME"  # the flag's value in --help
    HELP: ClassVar[str] = ""  # the flag's help

    @property
    @abstractmethod
    def value(self) -> object:
        """What the flag or the config key gave."""

    def check(self) -> None:
        """The value's type (and a subclass's own syntax): :class:`PlaceError` naming the key."""
        check_type(str(self.KEY), self.value, self.TYPE)

    @property
    def label(self) -> str:
        return f"{self.LABEL} {self.value}"

    @property
    def describe(self) -> str:
        return f"{self.NOUN} {self.value}"

    @property
    def short(self) -> str:
        """ "docker:train" in "h1/docker:train": its kind named, as two places of a host may share a name."""
        return f"{self.KEY}:" + re.sub(r"[^A-Za-z0-9_.-]", "-", str(self.value))

    @property
    def key(self) -> tuple:
        return (str(self.KEY), self.value)

    def config(self) -> dict:
        return {self.KEY: self.value}

    def flags(self) -> list[str]:
        return [str(self.FLAG), str(self.value)]

    def json(self) -> dict:
        return {self.JSON: self.value}
