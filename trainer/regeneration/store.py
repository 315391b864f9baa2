"""The output directory of a regeneration: append-only, resumable.

- ``DIR/regenerated.jsonl``: one result a line (``prompt_file.output_record``), in input order within a run;
  flushed after every line and fsynced at least once a second and at the end, so a killed run loses at most the
  line it was writing. On start the lines already there are read back (their keys are done); a truncated last
  line (a kill mid-write) is cut off, a malformed line elsewhere stops the run.
- ``DIR/failures.jsonl``: the prompts that failed after their retries in the latest run (key, input index,
  error); rewritten by every run, so a resumed run retries them.
- ``DIR/settings.json``: the generation settings of the first run; a run with other settings is refused (its
  keys would not match and the file would mix two generations).
"""

from __future__ import annotations

import json
import os
import time

OUTPUT, FAILURES, SETTINGS = "regenerated.jsonl", "failures.jsonl", "settings.json"


class StoreError(ValueError):
    pass


def check_settings(out_dir: str, settings: dict) -> None:
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, SETTINGS)
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            old = json.load(f)
        if old != settings:
            diff = sorted(k for k in set(old) | set(settings) if old.get(k) != settings.get(k))
            why = (
                " (the target's files changed since: retrained or replaced)" if "target_files" in diff else ""
            )
            raise StoreError(
                f"{out_dir} holds a regeneration with other settings ({', '.join(diff)}){why}; "
                "give another --output to start anew"
            )
        return
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(settings, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def done_keys(out_dir: str) -> set[str]:
    """Keys already in the output (read a line at a time); cuts a truncated last line off the file."""
    path = os.path.join(out_dir, OUTPUT)
    if not os.path.exists(path):
        return set()
    keys: set[str] = set()
    good_end = 0
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.endswith(b"\n"):
                break  # the last line, cut by a kill: dropped, generated again
            try:
                rec = json.loads(raw) if raw.strip() else {"key": None}
            except (ValueError, RecursionError):
                raise StoreError(f"{path}:{lineno}: not valid JSON (not the last line: refusing)") from None
            if raw.strip() and (not isinstance(rec, dict) or not isinstance(rec.get("key"), str)):
                raise StoreError(f"{path}:{lineno}: a line without its key")
            if rec.get("key"):
                keys.add(rec["key"])
            good_end += len(raw)
    if good_end != os.path.getsize(path):
        os.truncate(path, good_end)
    return keys


class Writer:
    def __init__(self, out_dir: str, fsync_every_s: float = 1.0):
        self._f = open(os.path.join(out_dir, OUTPUT), "a", encoding="utf-8")  # noqa: SIM115
        self._every, self._last = fsync_every_s, time.monotonic()

    def write(self, rec: dict) -> None:
        self._f.write(json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n")
        self._f.flush()
        if time.monotonic() - self._last >= self._every:
            self.sync()

    def sync(self) -> None:
        self._f.flush()
        os.fsync(self._f.fileno())
        self._last = time.monotonic()

    def close(self) -> None:
        self.sync()
        self._f.close()


def write_failures(out_dir: str, failures: list[dict]) -> None:
    path = os.path.join(out_dir, FAILURES)
    if not failures:
        if os.path.exists(path):
            os.remove(path)
        return
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for rec in failures:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
