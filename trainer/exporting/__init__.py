"""Checks a drafter directory (config.json + model.safetensors) against each server loader's rules.

``check_dir(path, servers, target=None) -> {server: [Problem]}`` (``check_config(config, ...)``: the same on a
config.json object alone, no weights) for ``servers`` among ``SERVERS``
(``zlab``: z-lab/dflash's transformers and MLX loaders; ``vllm``; ``sglang``); ``target`` is a
``reader.Target`` (``--target``) to compare depth, width, vocabulary and RoPE against; ``serving`` a
``train_serve.Serving`` (the target's tokenizer, the data's ``prepare.json``, ``--serve-thinking``) for the
train/serve checks (chat template, thinking, mask token; ``rope`` for the drafter's rotary embedding). The directory is read once,
bounded and without loading a tensor (``reader``); the rules shared by servers are in ``common`` and
``weights``, each server's own in its module (a directory in speculators' format: ``speculators``, on the
config vLLM builds from it, ``peers.vllm_view``), which names the code and commit it was read from. Imports
nothing from the rest of the trainer, nor torch: ``python -m trainer.export --check`` runs anywhere.
"""

from __future__ import annotations

from trainer.exporting import peers, rope, sglang, speculators, train_serve, vllm, zlab
from trainer.exporting.common import dflash_of
from trainer.exporting.problems import Problem
from trainer.exporting.reader import Export, Target, read_export
from trainer.exporting.train_serve import Serving

SERVERS = {"zlab": zlab.check, "vllm": vllm.check, "sglang": sglang.check}


def _train_serve(top: dict, server: str, target: Target | None, serving: Serving | None) -> list[Problem]:
    """RoPE as ``server`` builds it, and the checks against the target and the data (``train_serve``)."""
    head_dim = top.get("head_dim")
    out = rope.check(top, server, head_dim if type(head_dim) is int else None)
    return out + rope.against_target(top, target) + train_serve.check(top, dflash_of(top)[0], target, serving)


def _speculators(exp, server: str, target: Target | None, serving: Serving | None) -> list[Problem]:
    """A directory in speculators' format (``peers``): vLLM's rules on the config vLLM builds from it, the
    other servers' one error (``speculators``)."""
    out = speculators.check(exp, server, target)
    if server != "vllm":
        return out
    try:
        view = peers.vllm_view(exp.config)
    except peers.FormatError:
        return out  # said by speculators.check
    return out + speculators.renamed(_train_serve(view, server, target, serving))


def check_dir(
    path: str, servers: list[str], target: Target | None = None, serving: Serving | None = None
) -> dict[str, list[Problem]]:
    return _check(read_export(path), servers, target, serving)


def check_config(
    config: dict, servers: list[str], target: Target | None = None, serving: Serving | None = None
) -> dict[str, list[Problem]]:
    """``check_dir``'s rules on a config.json object alone (no weights): what a run's flags will export
    (``trainer.serve_check``)."""
    return _check(Export("(the run's drafter config)", config), servers, target, serving)


def _check(exp: Export, servers: list[str], target: Target | None, serving: Serving | None):
    out = {}
    for name in servers:
        problems = list(exp.problems)
        if exp.config is not None and peers.format_of(exp.config) == "speculators":
            problems += _speculators(exp, name, target, serving)
        elif exp.config is not None:
            problems += SERVERS[name](exp, target) + _train_serve(exp.config, name, target, serving)
        out[name] = problems
    return out
