"""The remote helper: a stdlib-only program the console starts once per connection.

It is sent as the program text of ``python3 -c`` (inside the container through ``pct exec N --``),
so nothing is installed remotely. It speaks one JSON object per line over stdin/stdout: first it
prints a hello, then it answers requests ``{"id": n, "op": ..., ...}`` with
``{"id": n, "ok": true, "result": ...}`` or ``{"id": n, "ok": false, "error": ..., "kind": ...}``.
Streaming requests (``follow``) also send ``{"id": n, "push": {...}}`` until cancelled. Requests
run concurrently: every one that touches a file or /proc runs on its own thread, so the request loop
never blocks (a stalled mount holds one thread, not the helper); it reads and writes only regular files
and never follows a symlink in a path's last part (``_open_file``: a FIFO, a device or a link is refused
at once). Bytes travel base64-encoded. It opens no port and exits when its stdin closes (its channel is
gone), even while a request is stuck; processes it spawned run on in their own session.

The program is written as the pieces of this package, by concern (:data:`PIECES`, in the order they are
sent), and :func:`program_text` joins them into the one text the client sends. The pieces must stay
runnable by any python3 >= 3.8 with the standard library alone: they import nothing from the console
(an import-linter contract), only the standard library and earlier pieces. A piece's imports of earlier
pieces (its relative imports, ``from .files import _open``, at the top level only) are what lets each
piece be imported here as a module (by the console and the tests); :func:`program_text` drops them, the
names being defined above them in the one program. The names the pieces define are one namespace
there: no two pieces may define the same name (:func:`program_text` refuses it).

This ``__init__`` is the console's side: it is not sent.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

# The program's pieces, in the order they are sent: each uses only the names of those before it at
# import time (a module-level value, a default argument); the last one runs main().
PIECES = ("framing", "identity", "files", "trees", "spawning", "run_threads", "loopback_http", "request_loop")


def _defined(tree: ast.Module) -> set[str]:
    """The names a piece defines at its top level (functions, classes, assigned names)."""
    out: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return out


def _piece(name: str, seen: set[str]) -> str:
    """The text of one piece as it is sent: its imports of earlier pieces dropped."""
    path = Path(__file__).with_name(f"{name}.py")
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text, str(path))
    drop: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level > 0:
            if node not in tree.body:
                raise ValueError(
                    f"{path}:{node.lineno}: a piece's import of another must be at its top level"
                )
            drop.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    names = _defined(tree)
    if names & seen:
        raise ValueError(f"{path}: {', '.join(sorted(names & seen))} defined by an earlier piece too")
    seen |= names
    lines = text.splitlines(keepends=True)
    return "".join(line for i, line in enumerate(lines, 1) if i not in drop)


@functools.cache
def program_text() -> str:
    """The source sent as ``python3 -c``: the pieces, in :data:`PIECES` order, as one program that only
    uses the standard library."""
    seen: set[str] = set()
    return "\n\n".join(f"# --- helper_program/{name}.py\n" + _piece(name, seen) for name in PIECES)
