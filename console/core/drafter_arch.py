"""The drafter's architecture of a run, from its run.json: ``drafter`` (the values the trainer resolved,
a resume's from its checkpoint) where the trainer writes it, else ``argv`` (its command-line flags).

``drafter_arch(run) -> {"arch", "name", "block_size"} | None``: ``--arch`` (``dflash``, the trainer's default,
when absent; ``dflash2``), its display name (``DFlash 1`` / ``DFlash 2``) and ``--block-size`` (the trainer's
default for the architecture when absent: 16, or 8 for DFlash 2). None without a run.json argv. The argv is
the record of what the trainer was started with, so a run started before ``--arch`` existed reads as DFlash 1,
which is what it trained.
"""

from __future__ import annotations

from console.core.control import flag_value

NAMES = {"dflash": "DFlash 1", "dflash2": "DFlash 2"}
DEFAULT_BLOCK = {"dflash": 16, "dflash2": 8}


def drafter_arch(run: dict | None) -> dict | None:
    resolved = run.get("drafter") if isinstance(run, dict) else None
    if (
        isinstance(resolved, dict) and resolved.get("arch") in NAMES
    ):  # what the trainer resolved (resumes too)
        block = resolved.get("block_size")
        arch = resolved["arch"]
        return {"arch": arch, "name": NAMES[arch], "block_size": block if isinstance(block, int) else None}
    argv = run.get("argv") if isinstance(run, dict) else None
    if not isinstance(argv, list):
        return None
    argv = [str(a) for a in argv]
    arch = flag_value(argv, "--arch") or "dflash"
    block = flag_value(argv, "--block-size")
    try:
        block_size = int(block) if block is not None else DEFAULT_BLOCK.get(arch)
    except ValueError:
        block_size = None
    return {"arch": arch, "name": NAMES.get(arch, arch), "block_size": block_size}


def arch_text(info: dict | None) -> str:
    if not info:
        return "-"
    return info["name"] + (f" (block {info['block_size']})" if info.get("block_size") else "")
