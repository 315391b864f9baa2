"""Deploying the bundled trainer into the container (content-addressed code directories), the code folder
as the console names it, and the interpreter's preflight."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import posixpath
import secrets
import time
from pathlib import Path

from console.core import sanitize
from console.core.control_error import ControlError
from console.core.helper import Helper, HelperError, HelperGone, b64encode

CODE_HOME = ".dflash-console/code"
LAST = "last"  # CODE_HOME/last: {"hash", "t"} of the last deployment to this place (deploy writes it)


def bundled_trainer_dir() -> Path:
    """Where the bundled ``trainer`` package lies, found without importing it."""
    spec = importlib.util.find_spec("trainer")
    if spec is None or not spec.submodule_search_locations:
        raise ControlError("the bundled trainer package is not installed next to the console")
    return Path(list(spec.submodule_search_locations)[0])


def bundled_trainer_files() -> tuple[str, list[tuple[str, bytes]]]:
    """(content hash, [(path relative to the code dir, bytes)]) of the bundled trainer package."""
    root = bundled_trainer_dir()
    files = []
    for p in sorted(root.rglob("*")):
        if not p.is_file() or "__pycache__" in p.parts or p.suffix in (".pyc", ".pyo"):
            continue
        files.append(("trainer/" + p.relative_to(root).as_posix(), p.read_bytes()))
    h = hashlib.sha256()
    for rel, data in files:
        h.update(rel.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()[:16], files


def _is_hash(name: str) -> bool:
    return len(name) == 16 and all(c in "0123456789abcdef" for c in name)


def code_folder(path: str | None) -> str | None:
    """The code directory as the console names it everywhere: the folder that holds the ``trainer``
    package (what PYTHONPATH needs; a deploy's ``.../.dflash-console/code/HASH``). A deployed package
    folder itself (``.../.dflash-console/code/HASH/trainer``, what run.json's ``code_dir`` said before) is
    taken as its parent; any other path as it is (:func:`resolve_code_folder` looks in the container)."""
    if not path:
        return path
    p = posixpath.normpath(path)
    parent = posixpath.dirname(p)
    deployed = _is_hash(posixpath.basename(parent)) and posixpath.dirname(parent).endswith("/" + CODE_HOME)
    return parent if posixpath.basename(p) == "trainer" and deployed else p


async def resolve_code_folder(helper: Helper, path: str | None) -> str | None:
    """:func:`code_folder`, and a checkout's package folder (``X/trainer`` holding ``pipeline.py``, with
    no ``trainer/`` package of its own) taken as ``X`` too: it is never a PYTHONPATH entry of its own."""
    p = code_folder(path)
    if not p or posixpath.basename(p) != "trainer":
        return p
    package = (await helper.stat(posixpath.join(p, "pipeline.py"))).get("exists")
    nested = (await helper.stat(posixpath.join(p, "trainer", "pipeline.py"))).get("exists")
    return posixpath.dirname(p) if package and not nested else p


def deployed_base(helper: Helper) -> str:
    """The folder deploys write their code directories into (``~/.dflash-console/code``)."""
    return posixpath.join(helper.home, CODE_HOME)


def is_deployed_path(path: str, base: str) -> bool:
    """``path`` names one of ``base``'s deployed code directories (``base/HASH``, 16 hex digits)."""
    p = posixpath.normpath(path)
    name = posixpath.basename(p)
    return posixpath.dirname(p) == posixpath.normpath(base) and _is_hash(name)


PREFLIGHT = "import torch, transformers"
PREFLIGHT_TIMEOUT_S = 180.0
PYTHON_HINT = "give the container's interpreter that has them with --python PATH (e.g. a venv's bin/python)"


async def preflight(
    helper: Helper,
    python: str,
    *,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    timeout: float = PREFLIGHT_TIMEOUT_S,
) -> None:
    """Run ``python -c "import torch, transformers"`` in the container as the trainer would start (its
    env and cwd), at most ``timeout`` s: :class:`ControlError` naming ``--python`` when it fails."""
    what = f"`{python} -c '{PREFLIGHT}'`"
    try:
        r = await helper.run([python, "-c", PREFLIGHT], cwd=cwd, env=env, timeout=timeout)
    except HelperError as e:
        raise ControlError(f"cannot run {python} in the container ({e}); {PYTHON_HINT}") from e
    if r.get("timed_out"):
        raise ControlError(f"{what} did not finish within {timeout:.0f} s in the container; {PYTHON_HINT}")
    if r.get("rc") != 0:
        lines = (r.get("stderr") or r.get("stdout") or "").strip().splitlines()
        why = lines[-1] if lines else f"exit code {r.get('rc')}"
        raise ControlError(
            f"{python} in the container cannot run the trainer: {what} failed ({why}); {PYTHON_HINT}"
        )


TMP_PATTERN = r"\.tmp-[0-9a-f]{16}-[0-9a-f]{8}"  # what deploy names its temporary folders
STALE_S = 600.0  # a temporary folder unchanged this long is no deploy under way (compiling is 120 s at most)


async def clean_stale(helper: Helper, base: str) -> list[str]:
    """Remove the temporary folders of deploys that a dropped link ended half-way (only names deploy
    makes, real folders of the helper's user, unchanged for :data:`STALE_S`; never through a link).
    Returns the names removed."""
    removed = await helper.call("clean_temp", path=base, pattern=TMP_PATTERN, older_s=STALE_S)
    return [str(n) for n in removed] if isinstance(removed, list) else []


async def deploy(helper: Helper, python: str = "python3", base: str | None = None, check: bool = True) -> str:
    """Copy the bundled trainer into ``~/.dflash-console/code/<hash>/`` and compile-check it there.

    The directory is named by content and written under a temporary name, then renamed: code that a
    running trainer imports is never written over. Temporary folders an earlier deploy left behind (a
    dropped link) are removed first (:func:`clean_stale`). Returns the code dir (it contains ``trainer/``).
    With ``check`` it first runs :func:`preflight` with ``python`` (nothing is written when that fails).
    """
    if check:
        await preflight(helper, python)
    digest, files = bundled_trainer_files()
    base = base or deployed_base(helper)
    await clean_stale(helper, base)
    final = posixpath.join(base, digest)
    if (await helper.stat(posixpath.join(final, ".complete"))).get("exists"):
        await _record_last(helper, base, digest)
        return final
    tmp = posixpath.join(base, f".tmp-{digest}-{secrets.token_hex(4)}")
    try:
        await helper.call(
            "write_files", root=tmp, files=[{"path": rel, "data": b64encode(data)} for rel, data in files]
        )
        r = await helper.run([python, "-m", "compileall", "-q", posixpath.join(tmp, "trainer")], timeout=120)
        if r["rc"] != 0:
            raise ControlError(
                f"the deployed trainer does not compile with {python} in the container:\n"
                + (r["stdout"] + r["stderr"]).strip()[-2000:]
            )
        manifest = {"hash": digest, "files": [rel for rel, _ in files], "t": time.time()}
        await helper.call(
            "write", path=posixpath.join(tmp, ".complete"), data=b64encode(json.dumps(manifest).encode())
        )
        try:
            await helper.call("rename", src=tmp, dst=final)
        except HelperError:
            if not (await helper.stat(posixpath.join(final, ".complete"))).get("exists"):
                raise
    finally:
        with contextlib.suppress(HelperError, HelperGone):
            if (await helper.stat(tmp)).get("exists"):
                await helper.call("rmtree", path=tmp)
    await _record_last(helper, base, digest)
    return final


async def _record_last(helper: Helper, base: str, digest: str) -> None:
    """Name ``base/digest`` the last deployment (a restart runs it: :func:`last_deployed`)."""
    rec = json.dumps({"hash": digest, "t": time.time()}).encode()
    await helper.call("write", path=posixpath.join(base, LAST), data=b64encode(rec))


async def last_deployed(helper: Helper, base: str | None = None) -> tuple[str, float] | None:
    """(code dir, when) of the last deployment to this place, None when there is none that verifies:
    ``base/last`` (a regular file, not a link) names a hash whose ``base/HASH/.complete`` is read with
    no link on the way (HASH a real folder) and names that hash too."""
    base = base or deployed_base(helper)
    try:
        rec = await helper.read_json(posixpath.join(base, LAST))
        digest = rec.get("hash") if isinstance(rec, dict) else None
        if not isinstance(digest, str) or not _is_hash(digest):
            return None
        data, _, _ = await helper.read(f"{digest}/.complete", root=base, length=1 << 20)
        manifest = sanitize.loads(data, max_bytes=1 << 20)  # bounded, and cleaned like every remote JSON
    except (HelperError, ValueError):  # absent, a link, not JSON: no deployment to speak of
        return None
    if not isinstance(manifest, dict) or manifest.get("hash") != digest:
        return None
    t = rec.get("t")
    return posixpath.join(base, digest), float(t) if isinstance(t, (int, float)) else 0.0
