"""A real small tmpfs for full-disk tests: mounted here (as root), or the test is skipped with the reason."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """``mount -t tmpfs -o size=SIZE`` on ``path`` (made if missing) for the block; unmounted after."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except OSError as e:
        pytest.skip(f"no tmpfs can be mounted here: {e}")
    if r.returncode != 0:
        pytest.skip(f"no tmpfs can be mounted here: {(r.stderr or r.stdout).strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)
