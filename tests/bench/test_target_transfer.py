"""bench/target_transfer.py: a trained bench target cut into parts a device call returns, and read back as
untrusted (plain regular files only); bench_acceptance refuses a fetched target that is not its run's."""

from __future__ import annotations

import io
import json
import os
import tarfile

import pytest

from bench import target_transfer as tt


def _target_dir(path, facts: dict | None = None) -> str:
    os.makedirs(path)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"model_type": "qwen3_5_text"}, f)
    with open(os.path.join(path, "model.safetensors"), "wb") as f:
        f.write(os.urandom(70_000))
    with open(os.path.join(path, tt.FACTS), "w") as f:
        json.dump(facts or {"target": {"arch": "qwen3_5", "shape": "h384"}, "size": "tiny"}, f)
    return str(path)


def _files(d: str) -> dict[str, bytes]:
    return {n: open(os.path.join(d, n), "rb").read() for n in sorted(os.listdir(d))}


def test_parts_come_back_as_the_same_directory(tmp_path):
    src = _target_dir(tmp_path / "target")
    parts = tt.pack(src, str(tmp_path / "out"), part_bytes=30_000)
    assert [os.path.basename(p) for p in parts] == [f"target.tar.part{i:02d}" for i in range(len(parts))]
    assert len(parts) >= 3 and all(os.path.getsize(p) <= 30_000 for p in parts)
    facts = tt.fetch_target(str(tmp_path / "out"), str(tmp_path / "again"))
    assert _files(str(tmp_path / "again")) == _files(src) and facts["size"] == "tiny"
    fewer = tt.pack(src, str(tmp_path / "out"), part_bytes=10**6)  # packed again: no stale part is left
    assert sorted(os.listdir(tmp_path / "out")) == ["target.tar.part00"] and len(fewer) == 1
    copied = tt.fetch_target(src, str(tmp_path / "copied"))  # a target directory as it is
    assert _files(str(tmp_path / "copied")) == _files(src) and copied == facts


def test_a_missing_part_is_refused(tmp_path):
    parts = tt.pack(_target_dir(tmp_path / "target"), str(tmp_path / "out"), part_bytes=30_000)
    os.remove(parts[1])
    with pytest.raises(tt.TransferError, match="not consecutive"):
        tt.fetch_target(str(tmp_path / "out"), str(tmp_path / "again"))


@pytest.mark.parametrize("name, kind", [("../escape", tarfile.REGTYPE), ("sub/x", tarfile.REGTYPE),
                                        ("link", tarfile.SYMTYPE)])  # fmt: skip
def test_a_tar_entry_that_is_not_a_plain_file_is_refused(tmp_path, name, kind):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.type, info.linkname = kind, "/etc/passwd" if kind == tarfile.SYMTYPE else ""
        tar.addfile(info, io.BytesIO(b"") if kind == tarfile.REGTYPE else None)
    os.makedirs(tmp_path / "parts")
    (tmp_path / "parts" / "target.tar.part00").write_bytes(buf.getvalue())
    with pytest.raises(tt.TransferError, match="not plainly named regular files"):
        tt.fetch_target(str(tmp_path / "parts"), str(tmp_path / "dest"))
    assert not os.path.exists(tmp_path / "dest") and not os.path.exists(tmp_path / "escape")


def test_a_symbolic_link_in_a_target_directory_is_not_followed(tmp_path):
    src = _target_dir(tmp_path / "target")
    (tmp_path / "secret").write_text("x")
    os.symlink(tmp_path / "secret", os.path.join(src, "tokenizer.json"))
    with pytest.raises(tt.TransferError, match="tokenizer.json"):
        tt.fetch_target(src, str(tmp_path / "dest"))


def test_bench_acceptance_refuses_a_target_of_another_arch(tmp_path):
    from bench import bench_acceptance as ba

    src = _target_dir(tmp_path / "target", {"target": {"arch": "qwen3", "shape": "h384"}, "size": "tiny",
                                            "corpus": {"sha256": "abc"}})  # fmt: skip
    ap = ba.build_parser()
    a = ap.parse_args(["--out", "o", "--tiny", "--target-arch", "qwen3_5", "--target-from", src])
    cfg, _, _ = ba.settle(ap, a)
    with pytest.raises(SystemExit, match="not this run's target.*'arch': \\('qwen3', 'qwen3_5'\\)"):
        ba.fetched_target(a, cfg, str(tmp_path / "dest"), [], {"sha256": "abc"})
