"""``python -m trainer.serve_check --serve vllm|sglang [--serve-thinking on|off] [--json] -- TRAINER_FLAGS``:
the train/serve checks of ``trainer.export --check``, before a run, from its flags alone (no weights).

TRAINER_FLAGS are ``python -m trainer.pipeline``'s. They are parsed and resolved by the trainer's own code
(``flags.build_parser``, ``settings.resolve``: a resumed checkpoint's drafter settings included) and the
drafter's config.json is made as its export will write it (``runtime.common.draft_config``,
``drafting.export_config.config_dict``); that config is checked with ``--serve``'s rules against the target
(``--target-model``: its config.json and tokenizer files) and the data (``--data-dir``'s ``prepare.json``,
against ``--serve-thinking``). Output as ``trainer.export --check``'s (trainer/exporting/report.py):
``SERVER: error|warning: KEY: what`` lines, or ``--json``. Exit 0: nothing fails (warnings are caveats);
1: a check fails; 2: bad usage, or flags the trainer itself refuses (said on stderr as ``error: ...``).
Reads JSON and the tokenizer's files only: transformers' ``AutoConfig``, never torch's models.
The console's launch runs it (console/core/serve_check.py; docs/serving.md)."""

from __future__ import annotations

import argparse
import sys

from trainer.drafting.export_config import config_dict
from trainer.exporting import SERVERS, check_config
from trainer.exporting.reader import ReadError, read_target
from trainer.exporting.report import print_results
from trainer.exporting.target_files import read_tokenizer
from trainer.exporting.train_serve import THINKING, Serving, read_prepared
from trainer.run.flags import FlagError, build_parser
from trainer.run.settings import resolve
from trainer.runtime.common import EXIT_USAGE, draft_config

USAGE = (
    "python -m trainer.serve_check --serve vllm|sglang [--serve-thinking on|off] [--json] -- TRAINER_FLAGS"
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m trainer.serve_check", usage=USAGE, description=__doc__)
    p.add_argument("--serve", required=True, choices=[s for s in SERVERS if s != "zlab"])
    p.add_argument("--serve-thinking", choices=THINKING, help="whether the server renders with thinking on")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    return p


def _split(argv: list[str]) -> tuple[list[str], list[str] | None]:
    if "--" not in argv:
        return argv, None
    i = argv.index("--")
    return argv[:i], argv[i + 1 :]


def drafter_config(flags: list[str]):
    """(the run's settings, the config.json its export will write); ``FlagError`` for flags the trainer
    refuses (argparse's own refusals exit 2 as the trainer's do)."""
    settings = resolve(build_parser().parse_args(flags))
    return settings, config_dict(draft_config(settings), "float32" if settings.export_fp32 else "bfloat16")


def main(argv: list[str] | None = None) -> int:
    mine, flags = _split(list(sys.argv[1:] if argv is None else argv))
    a = _parser().parse_args(mine)
    if not flags:
        print(f"error: give the trainer's flags after `--` ({USAGE})", file=sys.stderr)
        return EXIT_USAGE
    try:
        settings, config = drafter_config(flags)
        target = read_target(settings.target_model)
    except (FlagError, ReadError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    data, problems = read_prepared(settings.data_dir)
    serving = Serving(read_tokenizer(settings.target_model), data, tuple(problems), a.serve_thinking)
    results = check_config(config, [a.serve], target, serving)
    head = {"serve": a.serve, "serve_thinking": a.serve_thinking, "target": settings.target_model}
    return print_results(results, a.json, **head, data=settings.data_dir)


if __name__ == "__main__":
    sys.exit(main())
