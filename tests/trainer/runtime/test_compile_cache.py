"""The run's compile cache (trainer/runtime/compile_cache.py): reused by the same code and shapes, never by a
changed trainer file, torch or graph-shaping flag, and the reason says which."""

from __future__ import annotations

import argparse
import os
import py_compile
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.runtime import compile_cache

ROOT = Path(__file__).resolve().parents[3]
ENV_KEYS = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", compile_cache.ENV, "DFLASH_COMPILE_CACHE")


@pytest.fixture
def env(monkeypatch):
    for k in ENV_KEYS:
        monkeypatch.delenv(k, raising=False)  # restored after the test
    return monkeypatch


def flags(tiny_assets, **over) -> argparse.Namespace:
    base = {k: None for k in compile_cache.GRAPH_FLAGS}
    base.update(target_model=str(tiny_assets / "target"), token_budget=1024, max_seq_len=256, block_size=8)
    base.update(over)
    return argparse.Namespace(**base)


def test_same_code_and_shapes_reuse_it_a_change_never_does(tiny_assets, tmp_path, env):
    code = tmp_path / "code" / "trainer"
    shutil.copytree(ROOT / "trainer", code, ignore=shutil.ignore_patterns("__pycache__"))
    run = tmp_path / "run"

    first = compile_cache.prepare(str(run), flags(tiny_assets), str(code))
    assert first["state"] == "cold" and first["dir"] == str(run / "compile_cache")
    inductor = run / "compile_cache" / "inductor"
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(inductor)  # where torch's caches go now
    (inductor / "fxgraph-entry").write_text("compiled")  # what a compile leaves there

    again = compile_cache.prepare(str(run), flags(tiny_assets), str(code))
    assert again["state"] == "warm" and again["key"] == first["key"]
    assert (inductor / "fxgraph-entry").exists()  # reused

    (code / "model.py").write_text((code / "model.py").read_text() + "\n# edited\n")
    edited = compile_cache.prepare(str(run), flags(tiny_assets), str(code))
    assert edited["state"] == "stale" and edited["key"] != first["key"]
    assert "trainer code: trainer/model.py" in edited["reason"], edited["reason"]
    assert not (inductor / "fxgraph-entry").exists()  # the stale artifacts are gone, never loaded

    (inductor / "fxgraph-entry").write_text("compiled")
    shaped = compile_cache.prepare(str(run), flags(tiny_assets, token_budget=2048), str(code))
    assert shaped["state"] == "stale" and "flags: --token-budget" in shaped["reason"], shaped["reason"]
    assert "trainer code" not in shaped["reason"]
    assert not (inductor / "fxgraph-entry").exists()
    assert (
        compile_cache.prepare(str(run), flags(tiny_assets, token_budget=2048), str(code))["state"] == "warm"
    )
    # DFlash 2's modules change the drafter's graphs: another architecture or module size is another cache
    d2 = dict(token_budget=2048, arch="dflash2", selector_rank=8)
    arch = compile_cache.prepare(str(run), flags(tiny_assets, **d2), str(code))
    assert arch["state"] == "stale" and "flags: --arch, --selector-rank" in arch["reason"], arch["reason"]


def test_it_can_be_turned_off(tiny_assets, tmp_path, env):
    env.setenv("DFLASH_COMPILE_CACHE", "0")
    got = compile_cache.prepare(str(tmp_path / "run"), flags(tiny_assets))
    assert got["state"] == "off" and "TORCHINDUCTOR_CACHE_DIR" not in os.environ
    assert not (tmp_path / "run" / "compile_cache").exists()


def _fake_package(tmp_path, monkeypatch):
    pkg = tmp_path / "site" / "fakepkg_bc"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setattr(sys, "pycache_prefix", None)
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    monkeypatch.setenv("PYTHONPYCACHEPREFIX", "")  # so that the delenv below is undone after the test
    monkeypatch.delenv("PYTHONPYCACHEPREFIX")
    return pkg


@pytest.mark.e2e
def test_bytecode_cache_points_python_at_a_writable_folder_where_the_package_keeps_none(
    tmp_path, monkeypatch
):
    pkg = _fake_package(tmp_path, monkeypatch)
    real_access = os.access
    # a read-only site-packages (root, who runs the suite, passes chmod checks: the mount is what says no)
    monkeypatch.setattr(
        os, "access", lambda p, m: False if str(p).startswith(str(pkg)) else real_access(p, m)
    )
    said = compile_cache.bytecode_cache(str(tmp_path / "cache"), module="fakepkg_bc")
    got = str(tmp_path / "cache" / "pycache")
    assert said is not None and said.endswith(got)
    assert sys.pycache_prefix == got and os.environ["PYTHONPYCACHEPREFIX"] == got  # workers inherit it
    # a child started with that environment writes its compiled module there, not beside the source
    subprocess.run(
        [sys.executable, "-c", "import fakepkg_bc"],
        env={
            **{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
            "PYTHONPATH": str(pkg.parent),
        },
        check=True,
    )
    assert list(Path(got).rglob("__init__*.pyc")) and not (pkg / "__pycache__").exists()


def test_bytecode_cache_leaves_a_working_pycache_and_the_users_choice_alone(tmp_path, monkeypatch):
    pkg = _fake_package(tmp_path, monkeypatch)
    assert compile_cache.bytecode_cache(str(tmp_path / "cache"), module="fakepkg_bc") is None  # writable
    py_compile.compile(str(pkg / "__init__.py"))  # compiled bytecode present (a read-only image may ship it)
    real_access = os.access
    monkeypatch.setattr(
        os, "access", lambda p, m: False if str(p).startswith(str(pkg)) else real_access(p, m)
    )
    assert compile_cache.bytecode_cache(str(tmp_path / "cache"), module="fakepkg_bc") is None
    (pkg / "__pycache__").rename(tmp_path / "gone")
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # PYTHONDONTWRITEBYTECODE: the user's choice, named
    said = compile_cache.bytecode_cache(str(tmp_path / "cache"), module="fakepkg_bc")
    assert said is not None and "PYTHONDONTWRITEBYTECODE" in said
    assert sys.pycache_prefix is None and "PYTHONPYCACHEPREFIX" not in os.environ


def _warm(tiny_assets, run: Path, code: Path) -> None:
    compile_cache.prepare(str(run), flags(tiny_assets), str(code))
    (run / compile_cache.CACHE_DIR / "inductor" / "entry.py").write_text("x = 1\n")
    assert compile_cache.prepare(str(run), flags(tiny_assets), str(code))["state"] == "warm"


def test_a_cache_not_written_by_this_user_is_deleted_unread(tiny_assets, tmp_path, env):
    """Issue 33: torch runs what the cache holds; a planted link, a world-writable or a foreign entry makes
    it untrusted: deleted, never loaded."""
    code = tmp_path / "code" / "trainer"
    shutil.copytree(compile_cache.trainer_dir(), code, ignore=shutil.ignore_patterns("__pycache__"))
    run = tmp_path / "run"
    cache = run / compile_cache.CACHE_DIR
    target = tmp_path / "elsewhere.py"
    target.write_text("import os\n")
    _warm(tiny_assets, run, code)
    os.symlink(target, cache / "inductor" / "planted.py")
    got = compile_cache.prepare(str(run), flags(tiny_assets), str(code))
    assert got["state"] == "stale" and "planted.py is a symbolic link" in got["reason"], got
    assert not (cache / "inductor" / "planted.py").exists() and target.exists()  # the link's target stays
    _warm(tiny_assets, run, code)
    os.chmod(cache / "inductor" / "entry.py", 0o666)
    got = compile_cache.prepare(str(run), flags(tiny_assets), str(code))
    assert got["state"] == "stale" and "entry.py is writable by every user" in got["reason"], got
    if os.geteuid() == 0:  # another owner: only root can make one here
        _warm(tiny_assets, run, code)
        os.chown(cache / "inductor" / "entry.py", 12345, 12345)
        got = compile_cache.prepare(str(run), flags(tiny_assets), str(code))
        assert got["state"] == "stale" and "owned by uid 12345" in got["reason"], got
    # the whole folder a link: removed (not followed), a fresh cache in its place
    shutil.rmtree(cache)
    (tmp_path / "other").mkdir()
    os.symlink(tmp_path / "other", cache)
    got = compile_cache.prepare(str(run), flags(tiny_assets), str(code))
    assert got["state"] == "cold" and not cache.is_symlink() and cache.is_dir()
    assert list((tmp_path / "other").iterdir()) == []
