"""trainer/thread_names.py: the OS names (/proc/self/task/TID/comm) of the trainer's threads."""

from __future__ import annotations

import sys
import threading

import pytest

from trainer import thread_names
from trainer.runtime.background import Background
from trainer.thread_names import name_this_thread, named, os_name

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl names threads on Linux")


def comm(tid: int) -> str:
    with open(f"/proc/self/task/{tid}/comm") as f:
        return f.read().rstrip("\n")


def test_names_fit_the_kernels_15_bytes():
    assert os_name("dflash-meter") == b"dflash-meter"
    assert os_name("dflash-drafter0") == b"dflash-drafter0"  # 15: kept whole
    assert os_name("dflash-control-accept") == b"control-accept"  # the prefix goes first
    assert os_name("read-weights-1234567") == b"read-weights-12"
    assert os_name("é" * 10) == ("é" * 7).encode()  # never half a character
    assert os_name("a\0b") == b"ab"


def test_a_thread_names_itself_and_a_wrapped_target_takes_its_python_name():
    seen = {}

    def work():
        seen["tid"] = threading.get_native_id()
        seen["comm"] = comm(seen["tid"])

    t = threading.Thread(target=named(work), name="dflash-meter")
    t.start()
    t.join()
    assert seen["comm"] == "dflash-meter"

    def rename():
        assert name_this_thread("dflash-target0")
        seen["renamed"] = comm(threading.get_native_id())

    t = threading.Thread(target=rename)
    t.start()
    t.join()
    assert seen["renamed"] == "dflash-target0"


def test_background_work_runs_under_its_name():
    b = Background(lambda: comm(threading.get_native_id()), "load-target")
    assert b.result() == "load-target"


def test_without_prctl_nothing_happens(monkeypatch):
    monkeypatch.setattr(thread_names, "_prctl", False)
    assert name_this_thread("dflash-x") is False
