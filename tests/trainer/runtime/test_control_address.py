"""Where a ``--launch torchrun`` launcher listens: its flags, or DFLASH_CONTROL where they are left at their
defaults (a Slurm job's batch script sets it, so that the run's own flags are the same at every start)."""

from __future__ import annotations

from types import SimpleNamespace

from trainer.runtime.launcher import torchrun_address


def flags(host: str = "127.0.0.1", port: int = 0) -> SimpleNamespace:
    return SimpleNamespace(control_host=host, control_port=port)


def test_dflash_control_is_the_address_only_where_the_flags_say_nothing(monkeypatch):
    monkeypatch.delenv("DFLASH_CONTROL", raising=False)
    assert torchrun_address(flags()) == ("127.0.0.1", 0)
    monkeypatch.setenv("DFLASH_CONTROL", "node0:29600")
    assert torchrun_address(flags()) == ("node0", 29600)
    assert torchrun_address(flags("0.0.0.0", 29500)) == ("0.0.0.0", 29500)  # the operator's flags win
    assert torchrun_address(flags(port=29500)) == ("127.0.0.1", 29500)
    for bad in ("node0", ":29600", "h:port", ""):
        monkeypatch.setenv("DFLASH_CONTROL", bad)
        assert torchrun_address(flags()) == ("127.0.0.1", 0)
