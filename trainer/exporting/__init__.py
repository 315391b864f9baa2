"""Checks a drafter directory (config.json + model.safetensors) against each server loader's rules.

``check_dir(path, servers, target=None) -> {server: [Problem]}`` for ``servers`` among ``SERVERS``
(``zlab``: z-lab/dflash's transformers and MLX loaders; ``vllm``; ``sglang``); ``target`` is a
``reader.Target`` (``--target``) to compare depth, width and vocabulary against. The directory is read once,
bounded and without loading a tensor (``reader``); the rules shared by servers are in ``common`` and
``weights``, each server's own in its module, which names the code and commit it was read from. Imports
nothing from the rest of the trainer, nor torch: ``python -m trainer.export --check`` runs anywhere.
"""

from __future__ import annotations

from trainer.exporting import sglang, vllm, zlab
from trainer.exporting.problems import Problem
from trainer.exporting.reader import Target, read_export

SERVERS = {"zlab": zlab.check, "vllm": vllm.check, "sglang": sglang.check}


def check_dir(path: str, servers: list[str], target: Target | None = None) -> dict[str, list[Problem]]:
    exp = read_export(path)
    out = {}
    for name in servers:
        problems = list(exp.problems)
        if exp.config is not None:
            problems += SERVERS[name](exp, target)
        out[name] = problems
    return out
