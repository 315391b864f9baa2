"""Which of run.json's environment a restart passes on, and which of it changes what a process loads.

run.json's ``env`` is written by whoever can write the run directory. A restart never passes on the
trainer's test hooks (``DFLASH_TEST_*``: a production run does not take faults from its environment), and
a variable that changes what the interpreter or the dynamic loader loads (``LD_*``, ``PYTHON*`` other than
the harmless ones, ``PATH``, a plugin library, an extension folder) needs its own confirmation
(restart_trust.py). PYTHONPATH is checked as the code directory is.
"""

from __future__ import annotations

TEST_HOOK_PREFIXES = ("DFLASH_TEST_",)
# PYTHON* that change how the interpreter runs, not what it loads
HARMLESS_PYTHON = frozenset(
    {
        "PYTHONUNBUFFERED",
        "PYTHONHASHSEED",
        "PYTHONFAULTHANDLER",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONIOENCODING",
        "PYTHONUTF8",
    }
)
LOADER_NAMES = frozenset({"PATH", "TORCH_EXTENSIONS_DIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"})


def is_test_hook(name: str) -> bool:
    return name.startswith(TEST_HOOK_PREFIXES)


def changes_what_loads(name: str) -> bool:
    """``name`` chooses code or libraries a process loads (``PYTHONPATH`` aside: the code dir's check)."""
    if name.startswith("LD_") or name in LOADER_NAMES or name.endswith("_PLUGIN"):
        return True
    return name.startswith("PYTHON") and name != "PYTHONPATH" and name not in HARMLESS_PYTHON


def passed_env(env: object) -> tuple[dict[str, str], tuple[str, ...]]:
    """(what a restart passes on of run.json's ``env``, the test hooks it drops): string names only."""
    if not isinstance(env, dict):
        return {}, ()
    keep = {k: str(v) for k, v in env.items() if isinstance(k, str) and v is not None}
    dropped = tuple(sorted(k for k in keep if is_test_hook(k)))
    return {k: v for k, v in keep.items() if k not in dropped}, dropped
