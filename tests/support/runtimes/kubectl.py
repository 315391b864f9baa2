"""A ``kubectl`` STAND-IN (Kubernetes cannot run here: Debian packages no API server or kubelet, and none
installs without pulling images). It takes the argv the console sends the real kubectl,
``kubectl exec -i [-n NS] POD [-c CONTAINER] -- CMD...``, and runs CMD in a real Podman container named
``NS.POD`` (``default`` when no ``-n``); a pod that is not there is refused as kubectl refuses it."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from tests.support.runtimes.podman import Podman

_KUBECTL = """#!/bin/sh
# kubectl stand-in (tests/support/runtimes/kubectl.py): exec only, onto real Podman containers NS.POD
[ "$1" = exec ] || {{ echo "kubectl (stand-in): only exec is offered" >&2; exit 1; }}
shift; ns=default; pod=; while [ $# -gt 0 ]; do
    case "$1" in
        -i|--stdin) shift ;;
        -n|--namespace) ns=$2; shift 2 ;;
        -c|--container) shift 2 ;;
        --) shift; break ;;
        -*) echo "kubectl (stand-in): unknown flag $1" >&2; exit 1 ;;
        *) pod=$1; shift ;;
    esac
done
if ! {podman} container exists "$ns.$pod"; then
    echo "Error from server (NotFound): pods \\"$pod\\" not found" >&2; exit 1
fi
exec {podman} exec -i "$ns.$pod" "$@"
"""


class Kubectl(Podman):
    """Pods as Podman containers; :meth:`start` takes ``NS/POD`` and returns the ``--pod`` value."""

    def __init__(self, root: Path, run_root: Path) -> None:
        super().__init__(root, run_root)
        bin_dir = root / "bin"
        bin_dir.mkdir(exist_ok=True)
        (bin_dir / "kubectl").write_text(_KUBECTL.format(podman=shlex.quote(self.PROGRAM)))
        (bin_dir / "kubectl").chmod(0o755)
        self.env["PATH"] = f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"

    def start(self, name: str) -> str:
        ns, _, pod = name.rpartition("/")
        super().start(f"{ns or 'default'}.{pod}")
        return name

    def exec(self, name: str, *argv: str, **kw):
        ns, _, pod = name.rpartition("/")
        return super().exec(f"{ns or 'default'}.{pod}", *argv, **kw)
