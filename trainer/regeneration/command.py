"""The command line of ``python -m trainer.regenerate`` (docs/trainer.md "Regenerating responses with the
target").

    python -m trainer.regenerate --input prompts.jsonl --output DIR --endpoint URL --model NAME [...]
    python -m trainer.regenerate --input prompts.jsonl --output DIR --target-model PATH [--device cuda] [...]

Exit status: 0 when every prompt has its result in ``DIR/regenerated.jsonl``; 1 when some failed (counted on
stderr, listed in ``DIR/failures.jsonl``; run again to retry them); 2 for bad input or settings.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import stat
import sys

from trainer.regeneration import store
from trainer.regeneration.driver import regenerate, server_results
from trainer.regeneration.prompt_file import PromptError, read_prompts

DESCRIPTION = (
    "The target writes the responses to a prompts file, from an OpenAI-compatible server (--endpoint) or in "
    "this process (--target-model); resumable. Exit status: 0 all done, 1 some failed (DIR/failures.jsonl), "
    "2 bad input or settings."
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m trainer.regenerate", description=DESCRIPTION)
    p.add_argument("--input", required=True, help="JSONL: messages/conversations (chat) or prompt lines")
    p.add_argument("--output", required=True, help="output directory (resumed when it exists)")
    p.add_argument("--mode", choices=("chat", "completion"), default="chat")
    src = p.add_argument_group("an OpenAI-compatible server")
    src.add_argument("--endpoint", help="base URL, e.g. http://127.0.0.1:8000 (/v1 is added)")
    src.add_argument("--model", help="the served model's name")
    src.add_argument("--concurrency", type=int, default=16)
    src.add_argument("--retries", type=int, default=5, help="retries of a transient failure")
    src.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    src.add_argument("--backoff", type=float, default=1.0, help="first retry delay (doubles each time)")
    src.add_argument(
        "--api-key-env", metavar="VAR", help="environment variable holding the server's API key (Bearer)"
    )
    loc = p.add_argument_group("in-process generation")
    loc.add_argument("--target-model", help="local target directory")
    loc.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    loc.add_argument("--batch-size", type=int, default=16)
    loc.add_argument("--seed", type=int, default=0, help="sampling seed (temperature > 0)")
    gen = p.add_argument_group("generation")
    gen.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--max-tokens", type=int, default=1024)
    gen.add_argument(
        "--thinking",
        choices=("on", "off"),
        default=None,
        help="chat_template_kwargs enable_thinking (default: the template's own default)",
    )
    p.add_argument("--progress-every", type=float, default=2.0, help="seconds between progress lines")
    return p


def _check(a) -> str | None:
    if (a.endpoint is None) == (a.target_model is None):
        return "give either --endpoint (with --model) or --target-model"
    if a.endpoint is not None and not a.model:
        return "--endpoint needs --model"
    if a.api_key_env and not os.environ.get(a.api_key_env):
        return f"--api-key-env: ${a.api_key_env} is not set"
    if a.endpoint is not None and not a.endpoint.startswith(("http://", "https://")):
        return f"--endpoint: not an http(s) URL: {a.endpoint!r}"
    for name in ("concurrency", "batch_size", "max_tokens"):
        if getattr(a, name) < 1:
            return f"--{name.replace('_', '-')}: must be at least 1"
    if a.retries < 0 or a.timeout <= 0 or a.backoff < 0 or a.temperature < 0 or not 0 < a.top_p <= 1:
        return "--retries >= 0, --timeout > 0, --backoff >= 0, --temperature >= 0, 0 < --top-p <= 1"
    return None


def target_fingerprint(target_dir: str) -> str:
    """The local target as it is on disk: SHA-256 over each file's name, size and modification time (weights,
    config, tokenizer; links followed, as a hub cache's snapshot is links), so that output written by other
    weights at the same path (a retrained target) is never taken as done. Unreadable: the path alone."""
    h = hashlib.sha256()
    try:
        names = sorted(os.listdir(target_dir))[:10_000]
    except OSError:
        return "unreadable"
    for name in names:
        try:
            st = os.stat(os.path.join(target_dir, name))
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            h.update(f"{name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def settings_of(a) -> dict:
    """What makes two results comparable (part of every key): the source, the model (a local target's files
    too) and the sampling."""
    s = {"mode": a.mode, "temperature": a.temperature, "top_p": a.top_p, "max_tokens": a.max_tokens}
    s["thinking"] = a.thinking
    if a.endpoint:
        s.update(source="server", model=a.model)
    else:
        s.update(source="local", target_model=a.target_model, seed=a.seed)
        s["target_files"] = target_fingerprint(a.target_model)
    return s


def _results(a):
    if a.endpoint:
        from trainer.regeneration.client import ServerConfig

        key = os.environ.get(a.api_key_env) if a.api_key_env else None
        cfg = ServerConfig(a.endpoint, a.model, a.temperature, a.top_p, a.max_tokens, a.thinking,
                           a.timeout, a.retries, a.backoff, key)  # fmt: skip
        return server_results(cfg, a.concurrency)
    from trainer.regeneration.local import LocalConfig, local_results

    cfg = LocalConfig(a.target_model, a.device, a.batch_size, a.temperature, a.top_p, a.max_tokens,
                      a.thinking, a.seed)  # fmt: skip
    return local_results(cfg)


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    err = _check(a)
    if err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    settings = settings_of(a)
    try:
        prompts = read_prompts(a.input, a.mode, settings)
        summary = regenerate(prompts, a.output, settings, _results(a), a.progress_every)
    except (PromptError, store.StoreError, OSError) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    print(json.dumps(summary), flush=True)
    if summary["failed"]:
        print(
            f"regenerate: {summary['failed']} prompt(s) failed (input indices {summary['failed_indices']}"
            f"{'...' if summary['failed'] > 20 else ''}); see {a.output}/{store.FAILURES}; run again to retry",
            file=sys.stderr,
            flush=True,
        )
        return 1
    return 0
