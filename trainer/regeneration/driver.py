"""The regeneration loop: the prompts not yet in the output go to a generator, whose results come back in
input order and are appended as they arrive; failures are collected for ``failures.jsonl``.

A generator is ``results(prompts) -> iterator of (prompt, prompt_file.Reply or None, error or None)`` in the order of ``prompts``: ``server_results`` (threads, one request each) or ``local.local_results``
(batches).
"""

from __future__ import annotations

import collections
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from trainer.regeneration import client, store
from trainer.regeneration.prompt_file import Prompt, output_record


def server_results(cfg: client.ServerConfig, concurrency: int):
    """``concurrency`` requests in flight; at most ``4 * concurrency`` results wait for an earlier one."""

    def one(p: Prompt):
        try:
            return p, client.generate(cfg, p), None
        except (client.Permanent, client.Transient) as e:
            return p, None, str(e)
        except Exception as e:  # a bug or a reply we did not foresee: that prompt fails, the run goes on
            return p, None, f"{type(e).__name__}: {e}"

    def results(prompts: list[Prompt]):
        window: collections.deque = collections.deque()
        pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="regen")
        try:
            for p in prompts:
                window.append(pool.submit(one, p))
                if len(window) >= 4 * concurrency:
                    yield window.popleft().result()
            while window:
                yield window.popleft().result()
        finally:  # also when the loop stops early (Ctrl-C, a write error): requests not yet sent are not sent
            pool.shutdown(wait=True, cancel_futures=True)

    return results


class Progress:
    """``regenerate: done/total (pct) rate/s ETA, failed`` on stderr, at most every ``every`` seconds (and
    at the end); on a terminal one line rewritten in place."""

    def __init__(self, total: int, already: int, every: float = 2.0, stream=None):
        self.total, self.already, self.every = total, already, every
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.done = self.failed = self.tokens = 0
        self.t0 = self._last = time.monotonic()

    def line(self) -> str:
        n = self.already + self.done + self.failed
        took = max(time.monotonic() - self.t0, 1e-9)
        rate = (self.done + self.failed) / took
        left = self.total - n
        eta = f"{left / rate:.0f}s" if rate > 0 else "?"
        pct = 100.0 * n / max(self.total, 1)
        toks = f" {self.tokens / took:,.0f} tok/s," if self.tokens else ""
        return f"regenerate: {n}/{self.total} ({pct:.1f}%) {rate:.2f}/s{toks} ETA {eta}, failed {self.failed}"

    def step(self, ok: bool, force: bool = False, tokens: int | None = None) -> None:
        self.tokens += tokens or 0
        if ok:
            self.done += 1
        else:
            self.failed += 1
        now = time.monotonic()
        if force or now - self._last >= self.every:
            self._last = now
            self.show()

    def show(self, final: bool = False) -> None:
        end = "\n" if final or not self.tty else ""
        print(("\r" if self.tty else "") + self.line(), end=end, file=self.stream, flush=True)


def regenerate(prompts: list[Prompt], out_dir: str, settings: dict, results, progress_every=2.0) -> dict:
    """Generate what ``out_dir`` lacks; returns the summary (``failed`` > 0: some prompts failed)."""
    store.check_settings(out_dir, settings)
    done = store.done_keys(out_dir)
    todo = [p for p in prompts if p.key not in done]
    prog = Progress(len(prompts), len(prompts) - len(todo), progress_every)
    print(f"regenerate: {len(prompts)} prompt(s), {prog.already} already done", file=sys.stderr, flush=True)
    failures: list[dict] = []
    w = store.Writer(out_dir)
    try:
        for p, res, err in results(todo):
            if res is None:
                failures.append({"key": p.key, "index": p.index, "error": err})
            else:
                w.write(output_record(p, *res))
            prog.step(res is not None, tokens=res.tokens if res is not None else None)
    finally:
        w.close()
        store.write_failures(out_dir, failures)
    prog.show(final=True)
    took = time.monotonic() - prog.t0
    return {
        "prompts": len(prompts),
        "already_done": prog.already,
        "generated": prog.done,
        "failed": len(failures),
        "failed_indices": [f["index"] for f in failures][:20],
        "seconds": round(took, 3),
        "generated_tokens": prog.tokens,  # as the generator counts them (a server: its usage), end token included
        "tok_per_s": round(prog.tokens / took, 1) if took > 0 else None,
    }
