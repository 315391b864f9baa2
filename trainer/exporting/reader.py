"""Reading a drafter directory for the checks, bounded, without loading a tensor or running anything.

``read_export(dir) -> Export``: ``config`` (config.json's object, or None), ``tensors`` (model.safetensors'
header: ``{name: Tensor(dtype, shape)}``, or None) and ``problems`` (why either could not be read).
``read_target(dir) -> Target`` reads a target's config.json (its ``text_config`` when it has one: sizes,
RoPE) for ``--target``; a ``ReadError`` says why it cannot.

Bounds: config.json at most 1 MiB; the safetensors header at most 16 MiB (what a drafter of the most layers a
config may name needs, with room; the safetensors library allows 100 MB) and at most the file, read from its
8-byte little-endian length and then exactly that many bytes: the tensor data is never
read and nothing is unpickled. Both files must be regular files opened without following a symbolic link
(``O_NOFOLLOW``; a FIFO or device is refused without blocking). The header is validated as the safetensors
library does before a server gets a tensor: known dtypes, non-negative shapes, each entry's byte range equal
to its element count times its dtype size, the ranges contiguous from 0 and ending at the end of the file.
"""

from __future__ import annotations

import json
import os
import stat
import struct
from dataclasses import dataclass, field

from trainer.exporting.problems import Problem, error, key_of, shown

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
CONFIG_CAP = 1 << 20
# a drafter's header: ~150 bytes a tensor, ~20 tensors a layer: 1024 layers (common.MAX_LAYERS) need ~3 MB; 16 MiB
# parses in ~1.6 s and ~250 MB (the safetensors library allows 100 MB: 37 s and 1.1 GB here)
HEADER_CAP = 16 << 20
MAX_RANK = 8
# bytes per element of the safetensors dtypes
DTYPE_SIZES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U64": 8,
    "U32": 4,
    "U16": 2,
    "U8": 1,
    "BOOL": 1,
}


class ReadError(ValueError):
    """A file that cannot be read as what it should be; the message says why."""


@dataclass(frozen=True)
class Tensor:
    dtype: str
    shape: tuple[int, ...]


@dataclass
class Export:
    path: str
    config: dict | None = None
    tensors: dict[str, Tensor] | None = None
    problems: list[Problem] = field(default_factory=list)


@dataclass(frozen=True)
class Target:
    num_layers: int | None
    hidden_size: int | None
    vocab_size: int | None
    rope_theta: float | None = None  # what the trainer takes for the drafter (trainer/drafting/config.py)
    rope_type: str | None = None


def _open_regular(path: str) -> tuple[int, int]:
    """``(fd, size)`` of a regular file at ``path``, not through a symbolic link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise ReadError("missing") from None
    except OSError as e:
        if os.path.islink(path):
            raise ReadError("is a symbolic link: refused (point the check at the real directory)") from None
        raise ReadError(f"cannot be opened ({e.strerror})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise ReadError("is not a regular file")
    return fd, st.st_size


def _read_exactly(fd: int, n: int, offset: int) -> bytes:
    chunks, done = [], 0
    while done < n:
        got = os.pread(fd, n - done, offset + done)
        if not got:
            raise ReadError(f"ends after {offset + done} bytes, {n - done} short")
        chunks.append(got)
        done += len(got)
    return b"".join(chunks)


def _json(raw: bytes) -> object:
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ReadError("is not UTF-8 text") from None
    except RecursionError:
        raise ReadError("is nested too deeply to be a config") from None
    except ValueError as e:
        raise ReadError(f"is not valid JSON ({shown(str(e), 80)})") from None


def read_json_object(path: str, cap: int = CONFIG_CAP) -> dict:
    fd, size = _open_regular(path)
    try:
        if size > cap:
            raise ReadError(f"is {size} bytes, more than a config can be ({cap})")
        obj = _json(_read_exactly(fd, size, 0))
    finally:
        os.close(fd)
    if not isinstance(obj, dict):
        raise ReadError(f"holds a JSON {type(obj).__name__}, not an object")
    return obj


def _entry(name: str, v: object) -> tuple[Tensor, int, int]:
    if not isinstance(v, dict) or set(v) != {"dtype", "shape", "data_offsets"}:
        raise ReadError(f"header entry {key_of(name)} is not {{dtype, shape, data_offsets}}")
    dtype, shape, offsets = v["dtype"], v["shape"], v["data_offsets"]
    if dtype not in DTYPE_SIZES:
        raise ReadError(f"tensor {key_of(name)} has unknown dtype {shown(dtype)}")
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_RANK
        or any(type(d) is not int or d < 0 for d in shape)
    ):
        raise ReadError(
            f"tensor {key_of(name)} has shape {shown(shape)}, not a list of non-negative integers"
        )
    if not (
        isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int and o >= 0 for o in offsets)
    ):
        raise ReadError(f"tensor {key_of(name)} has data_offsets {shown(offsets)}")
    numel = 1
    for d in shape:
        numel *= d
    start, end = offsets
    if end - start != numel * DTYPE_SIZES[dtype]:
        raise ReadError(
            f"tensor {key_of(name)}: data_offsets span {end - start} bytes, its shape needs "
            f"{numel * DTYPE_SIZES[dtype]}"
        )
    return Tensor(dtype, tuple(shape)), start, end


def _tensors(meta: dict, data_len: int) -> dict[str, Tensor]:
    out, spans = {}, []
    for name, v in meta.items():
        if name == "__metadata__":
            if not isinstance(v, dict) or not all(isinstance(x, str) for x in v.values()):
                raise ReadError("__metadata__ is not a map of strings")
            continue
        t, start, end = _entry(name, v)
        out[name] = t
        spans.append((start, end, name))
    at = 0
    for start, end, name in sorted(spans):
        if start != at:
            raise ReadError(
                f"tensor {key_of(name)} starts at byte {start}, expected {at} (ranges must be contiguous)"
            )
        at = end
    if at != data_len:
        raise ReadError(f"the tensors cover {at} bytes of data, the file holds {data_len}")
    return out


def read_safetensors_header(path: str) -> dict[str, Tensor]:
    fd, size = _open_regular(path)
    try:
        if size < 8:
            raise ReadError("is shorter than a safetensors header length (8 bytes)")
        (n,) = struct.unpack("<Q", _read_exactly(fd, 8, 0))
        if n > HEADER_CAP:
            raise ReadError(f"declares a {n}-byte header, more than {HEADER_CAP}")
        if 8 + n > size:
            raise ReadError(f"declares a {n}-byte header but holds {size - 8} bytes after the length")
        meta = _json(_read_exactly(fd, n, 8))
    finally:
        os.close(fd)
    if not isinstance(meta, dict):
        raise ReadError("header is not a JSON object")
    return _tensors(meta, size - 8 - n)


def read_export(path: str) -> Export:
    exp = Export(path)
    if not os.path.isdir(path):
        exp.problems.append(error("directory", f"{shown(path, 200)} is not a directory"))
        return exp
    for name in (CONFIG_NAME, WEIGHTS_NAME):
        try:
            if name == CONFIG_NAME:
                exp.config = read_json_object(os.path.join(path, name))
            else:
                exp.tensors = read_safetensors_header(os.path.join(path, name))
        except ReadError as e:
            exp.problems.append(error(name, str(e)))
    return exp


def _int_or_none(d: dict, key: str) -> int | None:
    v = d.get(key)
    return v if type(v) is int and v > 0 else None


def read_target(path: str) -> Target:
    """The target's layer count, hidden size and vocabulary from its config.json (else ``ReadError``)."""
    try:
        top = read_json_object(os.path.join(path, CONFIG_NAME))
    except ReadError as e:
        raise ReadError(f"--target {shown(path, 200)}: {CONFIG_NAME} {e}") from None
    text = top.get("text_config") if isinstance(top.get("text_config"), dict) else top
    return Target(
        _int_or_none(text, "num_hidden_layers"),
        _int_or_none(text, "hidden_size"),
        _int_or_none(text, "vocab_size"),
        *_rope(text),
    )


def _rope(text: dict) -> tuple[float | None, str | None]:
    """(rope_theta, rope type) as the trainer reads the target's: ``rope_parameters`` (its
    ``full_attention`` entry when it has one per layer type), else ``rope_scaling`` and ``rope_theta``."""
    params = text.get("rope_parameters")
    if isinstance(params, dict) and isinstance(params.get("full_attention"), dict):
        params = params["full_attention"]
    if not isinstance(params, dict):
        params = text.get("rope_scaling") if isinstance(text.get("rope_scaling"), dict) else {}
    theta = params.get("rope_theta", text.get("rope_theta"))
    rtype = params.get("rope_type", params.get("type"))
    return (
        theta if type(theta) in (int, float) else None,
        rtype if isinstance(rtype, str) else None,
    )
