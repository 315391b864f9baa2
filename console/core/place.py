"""Where the trainer lives on an SSH host: the host itself, or one of the runtimes of console/core/places/
(a Proxmox container, an LXC, Docker or Podman container, a Kubernetes pod, a Slurm job). Everything the
console runs there (the helper, nvidia-smi) goes through :meth:`Place.command`; every name of it on the
screen, in the CLI's output and in errors comes from there.

Kinds are named by a CLI flag (``--ct N``, ``--docker NAME``, ...) and a config file key (``container =
N``, ``docker = "NAME"`` in ``[targets.NAME]``); both are read by the one :func:`parse`. A new kind is one
file of console/core/places/ (its flag, config key, value, exec prefix, label and help) added to
:data:`KINDS`; the CLI's flags are made from that list.
"""

from __future__ import annotations

from collections.abc import Mapping

from console.core.places.base import HOST, Host, Place, PlaceError, Runtime, check_type
from console.core.places.engines import Docker, Podman
from console.core.places.kubernetes import Kubernetes
from console.core.places.lxc import Lxc
from console.core.places.proxmox import Proxmox
from console.core.places.slurm import Slurm

__all__ = [
    "HOST",
    "Host",
    "Place",
    "PlaceError",
    "Runtime",
    "Proxmox",
    "Lxc",
    "Docker",
    "Podman",
    "Kubernetes",
    "Slurm",
    "KINDS",
    "BY_NAME",
    "CONFIG_KEYS",
    "parse",
    "from_config",
    "from_flags",
    "dest",
    "to_json",
    "from_json",
]

# The kinds a flag or a config key names (Host is what none of them names).
KINDS: tuple[type[Runtime], ...] = (Proxmox, Lxc, Docker, Podman, Kubernetes, Slurm)
BY_NAME: dict[str, type[Place]] = {
    **{k.FLAG: k for k in KINDS if k.FLAG},
    **{k.KEY: k for k in KINDS if k.KEY},
}
CONFIG_KEYS: dict[str, type] = {k.KEY: k.TYPE for k in KINDS if k.KEY}


def parse(name: str, value: object) -> Place:
    """The place a flag (``"--ct", 200``) or a config key (``"container", 200``) names; the one
    check of its value. :class:`PlaceError` for a wrong type (``container = "200"``, ``= true``)
    or a name that is no kind's."""
    kind = BY_NAME.get(name)
    if kind is None:
        raise PlaceError(f"{name} names no place (known: {', '.join(sorted(BY_NAME))})")
    check_type(name, value, kind.TYPE)
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
