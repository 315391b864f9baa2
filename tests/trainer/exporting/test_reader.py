"""The bounded reader: damaged or hostile files become one problem for every server, never an exception, a
hang or a terminal escape; the header is read without the tensor data."""

from __future__ import annotations

import json
import os
import struct

import pytest

from trainer.exporting import SERVERS, check_dir
from trainer.exporting.reader import ReadError, read_safetensors_header

ALL = list(SERVERS)


def only_problem(path) -> tuple[str, str]:
    """The one error every server reports, as ``(key, message)``."""
    res = check_dir(str(path), ALL)
    firsts = {(ps[0].key, ps[0].message) for ps in res.values()}
    assert len(firsts) == 1 and all(len(ps) == 1 for ps in res.values()), res
    return firsts.pop()


def _header(path, header: bytes, data: bytes = b"") -> None:
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)


def test_the_header_is_read_without_the_data(variant):
    path = variant("dflash") / "model.safetensors"
    tensors = read_safetensors_header(str(path))
    assert tensors["fc.weight"].shape == (64, 128) and tensors["fc.weight"].dtype == "BF16"


@pytest.mark.parametrize(
    "header, data, says",
    [
        (b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}', b"\0" * 8, "not valid JSON"),
        (b'{"a": {"dtype": "Q7", "shape": [2], "data_offsets": [0, 8]}}', b"\0" * 8, "unknown dtype"),
        (b'{"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}', b"\0" * 8, "its shape needs 12"),
        (b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}', b"\0" * 16, "contiguous"),
        (b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}', b"\0" * 4, "cover 8 bytes"),
        (b'{"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}', b"", "non-negative"),
        (b"[" * 5000 + b"]" * 5000, b"", "nested too deeply"),
    ],
)
def test_a_bad_header_is_one_error(variant, header, data, says):
    path = variant("dflash")
    _header(path / "model.safetensors", header, data)
    key, message = only_problem(path)
    assert key == "model.safetensors" and says in message


def test_a_header_length_past_the_file_or_the_cap_is_refused_unread(tmp_path):
    p = tmp_path / "w.safetensors"
    p.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    with pytest.raises(ReadError, match="more than"):
        read_safetensors_header(str(p))
    p.write_bytes(struct.pack("<Q", 100) + b"{}")
    with pytest.raises(ReadError, match="holds 2 bytes"):
        read_safetensors_header(str(p))
    p.write_bytes(b"\1\2")
    with pytest.raises(ReadError, match="shorter"):
        read_safetensors_header(str(p))


def test_a_symlinked_or_special_config_is_refused(variant, tmp_path):
    path = variant("dflash")
    real = tmp_path / "elsewhere.json"
    os.replace(path / "config.json", real)
    os.symlink(real, path / "config.json")
    assert only_problem(path)[1].startswith("is a symbolic link")
    os.unlink(path / "config.json")
    os.mkfifo(path / "config.json")  # opening it must not block
    assert only_problem(path) == ("config.json", "is not a regular file")


def test_a_config_that_is_not_an_object_or_too_big(variant):
    path = variant("dflash")
    (path / "config.json").write_text("[1, 2]")
    assert only_problem(path) == ("config.json", "holds a JSON list, not an object")
    (path / "config.json").write_text(" " * (1 << 20) + "{}")
    assert "more than a config can be" in only_problem(path)[1]
    os.unlink(path / "config.json")
    assert only_problem(path) == ("config.json", "missing")


def test_text_from_the_files_cannot_reach_a_terminal_raw(variant):
    def hostile(conf):
        conf["architectures"] = ["\x1b]52;c;cm0gLXJm\x07DFlash"]
        conf["dflash_config"]["mask_token_id"] = "\x9b2J"

    path = variant("dflash", hostile)
    lines = [p.line(s) for s, ps in check_dir(str(path), ALL).items() for p in ps]
    assert any("architectures" in line for line in lines)
    assert all(line.isascii() and "\x1b" not in line and "\x07" not in line for line in lines)
    json.dumps(lines)


def test_a_huge_layer_count_is_one_error_before_anything_is_sized_by_it(variant):
    """num_hidden_layers 10**18 grew the check to 13.5 GB (a list of every layer's tensors): it is one error of
    every server now, found before a list of layers is made."""

    def hostile(conf):
        conf["num_hidden_layers"] = 10**18
        conf.pop("layer_types", None)

    res = check_dir(str(variant("dflash", hostile)), ALL)
    for ps in res.values():
        errors = [p for p in ps if p.key == "num_hidden_layers"]
        assert len(errors) == 1 and "more than a drafter has (at most 1024)" in errors[0].message, ps


def test_a_header_a_drafter_never_needs_is_refused_unread(tmp_path):
    """A 98.6 MB header took 37.6 s and 1.1 GB: past 16 MiB (a drafter of 1024 layers needs ~3 MB) it is refused
    from its length alone, before a byte of it is read or parsed."""
    p = tmp_path / "w.safetensors"
    n = (16 << 20) + 1
    with open(p, "wb") as f:
        f.write(struct.pack("<Q", n))
        f.truncate(8 + n)  # a sparse file: the header's bytes are all there
    with pytest.raises(ReadError, match=f"declares a {n}-byte header, more than {16 << 20}"):
        read_safetensors_header(str(p))
