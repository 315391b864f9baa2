"""Weights read straight from safetensors files by several threads (trainer/target/raw_read.py, issue 22):
the header's byte ranges are the ones safetensors itself reads, chunks that split tensors at odd byte counts
land bit-exactly, progress rises to the total, and a damaged file is an error in the caller's thread."""

import os

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from trainer.target.raw_read import ParallelRead, header


def _tensors():
    g = torch.Generator().manual_seed(0)
    return {
        "a.bf16": torch.randn(33, 17, generator=g).to(torch.bfloat16),
        "b.f32": torch.randn(1001, generator=g),
        "c.i64": torch.randint(-(2**40), 2**40, (5, 3), generator=g),
        "d.bool": torch.rand(29, generator=g) > 0.5,
        "e.f16": torch.randn(2, 3, 4, generator=g).half(),
    }


def test_header_ranges_are_what_safetensors_reads(tmp_path):
    f = str(tmp_path / "w.safetensors")
    want = _tensors()
    save_file(want, f, metadata={"format": "pt"})
    entries = header(f)
    assert sorted(entries) == sorted(want)
    with open(f, "rb") as fh:
        raw = fh.read()
    with safe_open(f, framework="pt") as h:
        for k, e in entries.items():
            t = h.get_tensor(k)
            assert e.dtype == t.dtype and e.shape == tuple(t.shape)
            got = torch.frombuffer(bytearray(raw[e.start : e.end]), dtype=torch.uint8)
            assert torch.equal(got, t.contiguous().view(-1).view(torch.uint8)), k


def test_chunks_split_at_odd_bytes_land_bit_exactly(tmp_path, monkeypatch):
    monkeypatch.setattr(ParallelRead, "CHUNK", 7)  # every tensor in many chunks, cut mid-element
    monkeypatch.setattr(ParallelRead, "THREADS", 3)
    f = str(tmp_path / "w.safetensors")
    want = _tensors()
    save_file(want, f)
    entries = header(f)
    dst = {k: torch.empty_like(v) for k, v in want.items()}
    r = ParallelRead("cpu")
    for k in want:
        r.add(f, k, entries[k], dst[k])
    calls = []
    r.run(lambda d, t: calls.append((d, t)))
    for k, v in want.items():
        assert torch.equal(dst[k], v), k
    total = sum(v.numel() * v.element_size() for v in want.values())
    assert calls[-1] == (total, total)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)
    assert len(calls) == len(r.jobs) + 1  # every chunk as it lands, then the end


def test_bad_destination_and_truncated_file_are_errors(tmp_path):
    f = str(tmp_path / "w.safetensors")
    want = _tensors()
    save_file(want, f)
    entries = header(f)
    r = ParallelRead("cpu")
    with pytest.raises(ValueError, match="b.f32"):
        r.add(f, "b.f32", entries["b.f32"], torch.empty(1000))  # one element short
    with pytest.raises(ValueError, match="a.bf16"):
        r.add(f, "a.bf16", entries["a.bf16"], torch.empty(33, 17))  # another dtype
    last = max(entries, key=lambda k: entries[k].end)
    os.truncate(f, entries[last].end - 3)
    r = ParallelRead("cpu")
    r.add(f, last, entries[last], torch.empty_like(want[last]))
    with pytest.raises(OSError, match="short read"):
        r.run()
    assert not r.fds  # the files are closed after an error too
