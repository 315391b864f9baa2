"""docs/architecture.md stays true: its layout names every package and every top-level module of the
two trees, and every path it names exists."""

from __future__ import annotations

import re

from tests.support.trainer_run import ROOT

DOC = ROOT / "docs" / "architecture.md"
TREES = ("console", "trainer")
# a backticked path in the prose: `trainer/run/settings.py`, `runtime/hidden_queue.py`, `bench/`, `state.py`
PROSE_PATH = re.compile(r"`([A-Za-z_][\w./-]*(?:/[\w./-]*|\.py))`")


def _is_path(token: str) -> bool:
    return token.endswith("/") or token.endswith(".py")


def layout_paths(text: str) -> set[str]:
    """The paths of the layout block: a line's leading path tokens, each relative to the last folder of
    the nearest less-indented line above it."""
    block = text.split("```", 2)[1]
    parents: list[tuple[int, str]] = []  # (indent, folder) of the lines above
    out = set()
    for line in block.splitlines()[1:]:
        indent = len(line) - len(line.lstrip())
        tokens = []
        for token in line.split():
            if not _is_path(token):
                break
            tokens.append(token)
        if not tokens:
            continue
        while parents and parents[-1][0] >= indent:
            parents.pop()
        base = parents[-1][1] if parents else ""
        for token in tokens:
            out.add(base + token)
        folders = [t for t in tokens if t.endswith("/")]
        if folders:
            parents.append((indent, base + folders[-1]))
    return out


def packages() -> set[str]:
    found = set()
    for tree in TREES:
        for init in (ROOT / tree).rglob("__init__.py"):
            found.add(init.parent.relative_to(ROOT).as_posix() + "/")
    return found


def top_modules() -> set[str]:
    return {
        p.relative_to(ROOT).as_posix()
        for tree in TREES
        for p in (ROOT / tree).glob("*.py")
        if p.name != "__init__.py"
    }


def test_the_layout_names_every_package_and_top_level_module():
    named = layout_paths(DOC.read_text())
    missing = sorted((packages() | top_modules()) - named)
    assert not missing, f"docs/architecture.md's layout does not name: {missing}"


def test_every_path_the_layout_names_exists():
    gone = sorted(p for p in layout_paths(DOC.read_text()) if not (ROOT / p).exists())
    assert not gone, f"docs/architecture.md names paths that do not exist: {gone}"


def test_every_path_the_prose_names_exists():
    """Prose paths are relative to the repository, a tree, or the console's core."""
    bases = [ROOT, ROOT / "console", ROOT / "console" / "core", ROOT / "trainer"]
    text = DOC.read_text().split("```", 2)[2]
    gone = sorted(p for p in set(PROSE_PATH.findall(text)) if not any((b / p).exists() for b in bases))
    assert not gone, f"docs/architecture.md's prose names paths that do not exist: {gone}"
