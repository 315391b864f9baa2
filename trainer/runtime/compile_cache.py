"""The run's compile cache: torch's on-disk compile caches kept in the run directory for the next launch.

``prepare(run_dir, args, devices)`` (the launcher, or the single process, before anything compiles) keys
the cache by the trainer's code (every ``.py`` file of the ``trainer`` package), the torch and Python
versions, the target's config.json and the flags that change compiled graphs (``GRAPH_FLAGS``), then:

- the same key as the cache in ``RUN_DIR/compile_cache/`` -> ``warm``: reused;
- another key -> ``stale``: the old cache is deleted (never reused) and the reason names what changed
  (``trainer code: trainer/model.py``, ``torch 2.11.0 -> 2.12.0``, ``flags: --token-budget``, ...);
- none -> ``cold``.

The cache is code: torch imports inductor's generated modules, unpickles its graphs and loads Triton's
kernels from it. A warm cache holding a symbolic link, an entry another user owns or one writable by every
user is deleted unread (``stale``, "untrusted": ``untrusted``); one written by this trainer's own user is
trusted as the trainer's code is (docs/trainer.md, "What the trainer trusts").

It points torch at the folder (``TORCHINDUCTOR_CACHE_DIR``: inductor's FX graph cache, AOT autograd
cache and, below it, Triton's kernels; ``TRITON_CACHE_DIR``), turns those caches on, and returns what the
``compile_cache`` start-up event says. The environment carries it to the workers. ``DFLASH_COMPILE_CACHE=0``
leaves torch's defaults alone (state ``off``).

``load_mega(name)`` / ``save_mega(name)``: torch.compiler's portable "mega-cache" (torch >= 2.7:
``save_cache_artifacts`` / ``load_cache_artifacts``) of one process, saved after its first step and loaded
before it compiles, a second path to warm caches when the local ones are gone (another container).
``load_mega_async`` loads it in a thread beside the target's load (joined before the first compile).

``bytecode_cache()``: Python's own compile cache, for hosts whose site-packages cannot keep one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import threading
import time
from typing import Any

from trainer.run.rundir import atomic_write_text
from trainer.thread_names import named

CACHE_DIR = "compile_cache"
KEY_FILE = "key.json"
ENV = "DFLASH_COMPILE_CACHE_DIR"  # set by prepare(): the keyed folder (workers read it)
# the flags whose values shape the compiled graphs (and so the cached kernels)
GRAPH_FLAGS = (
    "token_budget",
    "max_seq_len",
    "max_batch_size",
    "block_size",
    "max_anchors",
    "est_anchors",
    "est_holdout",
    "num_draft_layers",
    "target_layer_ids",
    "layer_types",
    "sliding_window",
    "use_soft_labels",
    "labels",
    "divergence",
    "noise_type",
    "target_gpus",
    "drafter_gpus",
    "arch",
    "conv_kernel_size",
    "conv_group_size",
    "selector_rank",
    "selector_top_k",
)


def trainer_dir() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def code_hashes(root: str | None = None) -> dict[str, str]:
    """``{"trainer/x.py": sha256}`` for every Python file of the trainer package."""
    root = root or trainer_dir()
    base = os.path.dirname(root)
    out = {}
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__")
        for fn in sorted(files):
            if fn.endswith(".py"):
                p = os.path.join(d, fn)
                with open(p, "rb") as f:
                    out[os.path.relpath(p, base)] = hashlib.sha256(f.read()).hexdigest()
    return out


def torch_version() -> str:
    try:
        from importlib.metadata import version

        return version("torch")
    except Exception:  # noqa: BLE001 - not installed as a distribution
        return "unknown"


def components(args, code_root: str | None = None) -> dict[str, Any]:
    try:
        with open(os.path.join(args.target_model, "config.json"), "rb") as f:
            target = hashlib.sha256(f.read()).hexdigest()
    except OSError:
        target = None
    flags = {k: getattr(args, k, None) for k in GRAPH_FLAGS}
    return {
        "code": code_hashes(code_root),
        "torch": torch_version(),
        "python": sys.version.split()[0],
        "target_config": target,
        "flags": json.loads(json.dumps(flags, default=str)),
        "compile": os.environ.get("DFLASH_COMPILE", "1"),
    }


def key_of(comp: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(comp, sort_keys=True).encode()).hexdigest()[:16]


def what_changed(old: dict[str, Any], new: dict[str, Any]) -> str:
    parts = []
    oc, nc = old.get("code") or {}, new.get("code") or {}
    files = sorted(f for f in set(oc) | set(nc) if oc.get(f) != nc.get(f))
    if files:
        shown = ", ".join(files[:4]) + (f" (+{len(files) - 4} more)" if len(files) > 4 else "")
        parts.append(f"trainer code: {shown}")
    for k in ("torch", "python"):
        if old.get(k) != new.get(k):
            parts.append(f"{k} {old.get(k)} -> {new.get(k)}")
    if old.get("target_config") != new.get("target_config"):
        parts.append("target config.json")
    of, nf = old.get("flags") or {}, new.get("flags") or {}
    flags = sorted(k for k in set(of) | set(nf) if of.get(k) != nf.get(k))
    if flags:
        parts.append("flags: " + ", ".join("--" + k.replace("_", "-") for k in flags))
    if old.get("compile") != new.get("compile"):
        parts.append("DFLASH_COMPILE")
    return "; ".join(parts) or "unknown"


def prepare(run_dir: str, args, code_root: str | None = None) -> dict[str, Any]:
    """Key, check, clean and point torch at the run's compile cache; the ``compile_cache`` event's fields."""
    if os.environ.get("DFLASH_COMPILE_CACHE", "1") == "0":
        return {"state": "off", "reason": "DFLASH_COMPILE_CACHE=0"}
    folder = os.path.join(run_dir, CACHE_DIR)
    comp = components(args, code_root)
    key = key_of(comp)
    state, reason = "cold", "no cache in this run directory yet"
    try:
        with open(os.path.join(folder, KEY_FILE), encoding="utf-8") as f:
            old = json.load(f)
        if old.get("key") == key:
            state, reason = "warm", "same trainer code, torch and shapes"
        else:
            state, reason = "stale", "changed: " + what_changed(old.get("components") or {}, comp)
    except (OSError, ValueError, AttributeError):
        pass
    why = untrusted(folder) if state == "warm" else None
    if why is not None:  # loading it would run what is in it: not written by this trainer's user
        state, reason = "stale", f"untrusted, deleted unread: {why}"
    if state != "warm":
        if os.path.islink(folder):  # rmtree refuses a link, and makedirs would follow it
            os.unlink(folder)
        shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(os.path.join(folder, "inductor"), exist_ok=True)
    if state != "warm":
        atomic_write_text(os.path.join(folder, KEY_FILE), json.dumps({"key": key, "components": comp}))
    use(folder)
    return {"state": state, "key": key, "dir": folder, "reason": reason}


def untrusted(folder: str, limit: int = 200_000) -> str | None:
    """Why the cache in ``folder`` is not to be loaded, or None: torch runs what it holds (inductor's
    generated modules are imported, its pickles unpickled, Triton's kernels loaded), so every entry must be
    this trainer user's own: no symbolic link, no entry of another owner, nothing writable by every user."""
    uid, n = os.geteuid(), 0
    if (why := _entry_untrusted(folder, uid)) is not None:
        return why
    for d, dirs, files in os.walk(folder):  # never into a linked folder: links are refused below
        for name in (*dirs, *files):
            n += 1
            if n > limit:
                return f"more than {limit} entries in {folder}"
            if (why := _entry_untrusted(os.path.join(d, name), uid)) is not None:
                return why
    return None


def _entry_untrusted(path: str, uid: int) -> str | None:
    import stat

    try:
        st = os.lstat(path)
    except OSError as e:
        return f"{path}: {e.strerror or e}"
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link"
    if st.st_uid != uid:
        return f"{path} is owned by uid {st.st_uid}, not by this trainer's ({uid})"
    if st.st_mode & stat.S_IWOTH:
        return f"{path} is writable by every user"
    return None


def use(folder: str) -> None:
    """Point torch's compile caches at ``folder`` (the environment: read when torch compiles)."""
    os.environ[ENV] = folder
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(folder, "inductor")
    os.environ["TRITON_CACHE_DIR"] = os.path.join(folder, "inductor", "triton")
    os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
    os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "1")
    if "torch._inductor.config" in sys.modules:  # already imported: set it there too
        cfg = sys.modules["torch._inductor.config"]
        with contextlib.suppress(AttributeError):
            cfg.fx_graph_cache = True
            cfg.autograd_cache = True


def bytecode_cache(root: str | None = None, module: str = "torch") -> str | None:
    """Where torch's own Python files have no compiled bytecode and cannot keep it (a read-only
    site-packages without ``__pycache__``, as in some images), every launch compiles ~2,400 modules again:
    ~8 s of a restart on an H200 host. There, point Python's bytecode cache at a writable folder
    (``sys.pycache_prefix`` for this process, ``PYTHONPYCACHEPREFIX`` for the workers it starts). Returns a
    line for the log when there is something to say (what it did, or that ``PYTHONDONTWRITEBYTECODE``
    costs every launch those seconds: the user's setting, left alone), else None. Call before torch is
    imported."""
    import importlib.util

    if sys.pycache_prefix or module in sys.modules:
        return None
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin:
        return None
    cached = importlib.util.cache_from_source(spec.origin)
    if os.path.exists(cached):
        return None
    if sys.dont_write_bytecode:
        return (
            f"python bytecode: PYTHONDONTWRITEBYTECODE is set and {module} has no compiled bytecode, so every "
            "launch compiles its modules again (seconds of each start); unset it to keep them"
        )
    folder = os.path.dirname(cached)
    if os.access(folder if os.path.isdir(folder) else os.path.dirname(folder), os.W_OK):
        return None  # the usual __pycache__ (written by this launch)
    root = root or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "dflash")
    prefix = os.path.join(root, "pycache")
    try:
        os.makedirs(prefix, exist_ok=True)
    except OSError:
        return None
    if not os.access(prefix, os.W_OK):
        return None
    sys.pycache_prefix = prefix
    os.environ["PYTHONPYCACHEPREFIX"] = prefix
    return f"python bytecode: {module}'s folder cannot keep compiled modules; cached in {prefix}"


def _mega_path(name: str) -> str | None:
    folder = os.environ.get(ENV)
    return os.path.join(folder, f"mega-{name}.bin") if folder else None


def load_mega(name: str) -> bool:
    """Load this process's saved mega-cache, if there is one (before anything compiles)."""
    path = _mega_path(name)
    if path is None or not os.path.exists(path):
        return False
    try:
        import torch

        with open(path, "rb") as f:
            torch.compiler.load_cache_artifacts(f.read())
        return True
    except Exception:  # noqa: BLE001 - an unreadable cache is only a cold start
        return False


def load_mega_async(name: str, log=None) -> threading.Thread | None:
    """``load_mega`` in a thread, so its seconds (inductor's imports, writing the artifacts) overlap the
    target's load; the caller joins it before anything compiles. None when there is nothing to load."""
    path = _mega_path(name)
    if path is None or not os.path.exists(path):
        return None

    def run() -> None:
        t0 = time.monotonic()
        ok = load_mega(name)
        if log is not None:
            log(
                f"compile cache: mega-cache {'loaded' if ok else 'unreadable, skipped'} in {time.monotonic() - t0:.1f}s"
            )

    t = threading.Thread(target=named(run), name="load-mega-cache", daemon=True)
    t.start()
    return t


def save_mega(name: str) -> int:
    """Save this process's compile artifacts (after its first step); bytes written, 0 if none."""
    path = _mega_path(name)
    if path is None:
        return 0
    try:
        import torch

        got = torch.compiler.save_cache_artifacts()
        if not got or not got[0]:
            return 0
        tmp = path + f".tmp-{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(got[0])
        os.replace(tmp, path)
        return len(got[0])
    except Exception:  # noqa: BLE001 - best effort
        return 0
