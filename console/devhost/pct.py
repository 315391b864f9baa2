"""The ``pct`` stand-in: ``pct exec N -- cmd ...`` runs cmd in the folder that plays container N.

Like Proxmox's ``pct exec`` it execs the command directly (no shell), with the container's HOME and
working directory; unknown containers are refused the way pct refuses them. It is a small POSIX sh
script, written with the containers' root baked in (quoted with shlex).
"""

from __future__ import annotations

import shlex
from pathlib import Path

_SCRIPT = """#!/bin/sh
# pct stand-in written by console.devhost (console/devhost/pct.py): `pct exec CT -- CMD [ARGS...]`
# runs CMD in the folder that plays container CT, as its HOME and working directory.
set -e
if [ "$1" != exec ] || [ $# -lt 2 ]; then
    echo "pct (devhost stand-in): only 'pct exec CT -- CMD [ARGS...]' is offered" >&2
    exit 2
fi
ct=$2
shift 2
case "$ct" in
    ''|*[!0-9]*) echo "pct: invalid vmid '$ct'" >&2; exit 2 ;;
esac
if [ "${{1:-}}" = "--" ]; then shift; fi
if [ $# -eq 0 ]; then echo "pct: missing command" >&2; exit 2; fi
dir={root_q}/"$ct"
if [ ! -d "$dir" ]; then
    echo "Configuration file 'nodes/devhost/lxc/$ct.conf' does not exist" >&2
    exit 2
fi
cd "$dir"
HOME="$dir"
export HOME
exec "$@"
"""


def write_pct(path: Path, containers_root: Path) -> None:
    """Write the stand-in script to ``path`` (executable) for containers under ``containers_root``."""
    containers_root.mkdir(parents=True, exist_ok=True)
    path.write_text(_SCRIPT.format(root_q=shlex.quote(str(containers_root))))
    path.chmod(0o755)
