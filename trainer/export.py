"""``python -m trainer.export --check zlab,vllm,sglang DIR``: does DIR load as each server would load it?

DIR is a drafter directory (a checkpoint's ``export/`` or ``drafter/``, or any ``config.json`` +
``model.safetensors``). For each server named (comma-separated: ``zlab``, ``vllm``, ``sglang``, or ``all``) it
prints one line per problem, ``SERVER: error|warning: KEY: what``, then ``SERVER: ok`` or ``SERVER: failed``.
Exit 0 when no server has an error (warnings are caveats: it loads and serves as trained), 1 when one has, 2
on bad usage. ``--json`` prints one JSON object instead: ``{"dir", "ok", "servers": {name: {"ok", "problems":
[{"severity", "key", "message"}]}}}``. ``--target TDIR`` also compares the drafter with that target's
config.json (layer count, hidden size, vocabulary, RoPE) and its tokenizer (the mask token is no other token).
``--data DATA_DIR`` compares the chat template the data was prepared with (its ``prepare.json``) with the
target's, and ``--serve-thinking on|off`` the data's thinking with the server's. The rules and their
sources: docs/model.md, "What each server reads" and "Train/serve checks"; the code: trainer/exporting/.

``python -m trainer.export --to speculators|zlab SRC OUT`` writes SRC (a drafter directory, a checkpoint or a
run directory, in our layout, z-lab's, SpecForge's or speculators') to the new or empty directory OUT in
speculators' format (``--verifier PATH_OR_NAME``: the target vLLM serves it with; ``vllm serve OUT``) or in
the z-lab layout (``--target TDIR`` when SRC lacks ``num_target_layers``). Exit 0 written, 2 refused (one
line saying why; nothing written). The formats: docs/model.md, "Peer formats"; the code:
trainer/exporting/peers.py and convert.py.
"""

from __future__ import annotations

import argparse
import os
import sys

from trainer.exporting import SERVERS, check_dir
from trainer.exporting.convert import FORMATS, convert
from trainer.exporting.peers import FormatError
from trainer.exporting.problems import shown
from trainer.exporting.reader import ReadError, read_target
from trainer.exporting.report import print_results
from trainer.exporting.target_files import read_tokenizer
from trainer.exporting.train_serve import THINKING, Serving, read_prepared


def _servers(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    if names == ["all"]:
        return list(SERVERS)
    bad = [n for n in names if n not in SERVERS]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"unknown server {shown(bad[0]) if bad else '(none)'}: "
            f"one or more of {', '.join(SERVERS)} (comma-separated), or all"
        )
    return list(dict.fromkeys(names))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m trainer.export", description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument(
        "--check",
        type=_servers,
        metavar="SERVERS",
        help="comma-separated: zlab, vllm, sglang (or all)",
    )
    mode.add_argument(
        "--to", choices=FORMATS, help="write DIR to OUT in speculators' format or the z-lab layout"
    )
    p.add_argument("dir", metavar="DIR", help="the drafter directory (config.json + model.safetensors)")
    p.add_argument("out", metavar="OUT", nargs="?", help="--to: the new or empty directory to write")
    p.add_argument(
        "--verifier",
        metavar="PATH_OR_NAME",
        help="--to speculators: the verifier (target) path or hub name written into speculators_config",
    )
    p.add_argument(
        "--target", metavar="TDIR", help="the target model directory, to compare against its config"
    )
    p.add_argument(
        "--data",
        metavar="DATA_DIR",
        help="the data the drafter was trained on (trainer.prepare's output): its chat template and "
        "thinking against the target's template (--target) and --serve-thinking",
    )
    p.add_argument(
        "--serve-thinking",
        choices=THINKING,
        help="whether the server renders prompts with thinking on (needs --data)",
    )
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    return p


def _serving(a) -> Serving | None:
    """What --target, --data and --serve-thinking say about serving; ``ReadError`` for bad usage."""
    if a.serve_thinking and not a.data:
        raise ReadError("--serve-thinking needs --data DATA_DIR (the prepared data it is compared with)")
    if a.data and not os.path.isdir(a.data):
        raise ReadError(f"--data {shown(a.data, 200)} is not a directory")
    if not a.target and not a.data:
        return None
    data, problems = read_prepared(a.data) if a.data else (None, [])
    tok = read_tokenizer(a.target) if a.target else None
    return Serving(tok, data, tuple(problems), a.serve_thinking)


def _convert(a) -> int:
    """--to: SRC resolved as the evaluator resolves --drafter (a checkpoint's export/, a run's newest)."""
    from trainer.evaluation.load import EvalError, resolve_drafter_dir

    try:
        if not a.out:
            raise ReadError("--to needs SRC and OUT")
        if a.data or a.serve_thinking or a.json:
            raise ReadError("--data, --serve-thinking and --json are --check's, not --to's")
        if a.to == "speculators" and not a.verifier:
            raise ReadError("--to speculators needs --verifier PATH_OR_NAME (the target vLLM serves it with)")
        target = read_target(a.target) if a.target else None
        src = resolve_drafter_dir(a.dir)
        fmt = convert(src, a.out, a.to, a.verifier, target and target.num_layers)
    except (ReadError, FormatError, EvalError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {a.out}: {src} ({fmt} layout) in the {a.to} layout")
    return 0


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    if a.to:
        return _convert(a)
    if a.out or a.verifier:
        print("error: OUT and --verifier are --to's (--check reads DIR only)", file=sys.stderr)
        return 2
    try:
        target = read_target(a.target) if a.target else None
        serving = _serving(a)
    except ReadError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return print_results(check_dir(a.dir, a.check, target, serving), a.json, dir=a.dir)


if __name__ == "__main__":
    sys.exit(main())
