"""The drafters' training text for bench_acceptance.py, made by the project's own tools (issue 37): the
original text (a chunk's first ``PROMPT`` bytes as the prompt, its next bytes as the response) or the
target's own response to the same prompt (``python -m trainer.regenerate``, in-process batched decoding),
both tokenized by ``python -m trainer.prepare`` into the trainer's data format, the loss on the response.

The bench's target is byte-level (ids 0-255 are the bytes, ``<eos>`` 256, the drafter's mask 257):
``save_byte_tokenizer`` gives its directory the tokenizer those tools load (a byte-level BPE with no merges
whose ids are the byte values, so text and ids convert one to one). Prompts and responses travel as text, so
only chunks whose two parts are valid UTF-8 are used (the standard library's sources nearly all are).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from bench import regen_reuse

EOS_TEXT, MASK_TEXT = "<eos>", "<mask>"


def byte_chars() -> list[str]:
    """GPT-2's byte-to-character table (what a ByteLevel pre-tokenizer writes for byte b)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


def save_byte_tokenizer(target_dir: str) -> None:
    """A ``PreTrainedTokenizerFast`` whose id of each byte is the byte's value, ``<eos>`` 256, ``<mask>`` 257."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE(vocab={c: b for b, c in enumerate(byte_chars())}, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(EOS_TEXT, special=True), AddedToken(MASK_TEXT, special=True)])
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token=EOS_TEXT, pad_token=EOS_TEXT)
    assert tok(bytes(range(32, 127)).decode())["input_ids"] == list(range(32, 127))
    assert tok.convert_tokens_to_ids([EOS_TEXT, MASK_TEXT]) == [256, 257]
    tok.save_pretrained(target_dir)


def text_pairs(seqs: list[list[int]], prompt: int, new: int) -> tuple[list[dict], int]:
    """``{"prompt", "completion"}`` of each sequence (its first ``prompt`` bytes, the next ``new``), the
    sequences whose parts are not both valid UTF-8 left out; (the pairs, how many were left out)."""
    out, skipped = [], 0
    for s in seqs:
        try:
            p, c = bytes(s[:prompt]).decode("utf-8"), bytes(s[prompt : prompt + new]).decode("utf-8")
        except UnicodeDecodeError:
            skipped += 1
            continue
        out.append({"prompt": p, "completion": c})
    return out, skipped


def _start(argv: list[str], log: str, env: dict, cwd: str):
    """Start ``argv`` with its stderr appended to ``log``; the returned ``wait()`` gives its stdout (or stops
    the bench naming the log when it failed)."""
    f = open(log, "a")  # noqa: SIM115 (closed by wait)
    f.write(f"$ {' '.join(argv)}\n")
    f.flush()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=f, text=True, env=env, cwd=cwd)

    def wait() -> str:
        out, _ = proc.communicate()
        f.close()
        if proc.returncode != 0:
            raise SystemExit(f"{argv[2]} exited {proc.returncode} (see {log})")
        return out

    return wait


def prepare(target: str, raw: str, data_dir: str, log: str, env: dict, cwd: str):
    """Start ``trainer.prepare`` of a prompt/completion file into ``data_dir`` (its ``*.jsonl`` replaced);
    call the result to wait for it."""
    os.makedirs(data_dir, exist_ok=True)
    for name in os.listdir(data_dir):
        if name.endswith(".jsonl"):
            os.remove(os.path.join(data_dir, name))
    argv = [sys.executable, "-m", "trainer.prepare", "--tokenizer", target, "--input", raw,
            "--output-dir", data_dir, "--overwrite"]  # fmt: skip
    return _start(argv, log, env, cwd)


def regenerate(
    target: str, pairs: list[dict], out_dir: str, cfg: dict, log: str, env: dict, cwd: str
) -> dict:
    """The target's greedy response to each pair's prompt (``trainer.regenerate`` in this process's
    device, batch ``cfg["regen_batch"]``, ``cfg["regen_new"]`` tokens): its summary (tok/s) and the
    ``{"prompt", "completion"}`` file it wrote (``raw``)."""
    os.makedirs(out_dir, exist_ok=True)
    prompts = os.path.join(out_dir, "prompts.jsonl")
    with open(prompts, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"prompt": x["prompt"]}, ensure_ascii=False) + "\n" for x in pairs)
    argv = [sys.executable, "-m", "trainer.regenerate", "--input", prompts, "--output",
            os.path.join(out_dir, "out"), "--mode", "completion", "--target-model", target, "--device",
            cfg["device"], "--batch-size", str(cfg["regen_batch"]), "--max-tokens", str(cfg["regen_new"]),
            "--progress-every", "10"]  # fmt: skip
    summary = json.loads(_start(argv, log, env, cwd)().strip().splitlines()[-1])
    raw = os.path.join(out_dir, "regenerated.jsonl")
    with open(os.path.join(out_dir, "out", "regenerated.jsonl"), encoding="utf-8") as f, open(raw, "w") as g:
        for line in f:
            rec = json.loads(line)
            g.write(json.dumps({"prompt": rec["prompt"], "completion": rec["completion"]}) + "\n")
    regen_reuse.write_meta(raw, target, cfg["regen_new"])  # a later run may take it (--regen-from)
    summary["raw"] = raw
    summary["batch"] = cfg["regen_batch"]
    return summary


def write_pairs(path: str, pairs: list[dict]) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(x, ensure_ascii=False) + "\n" for x in pairs)
    return path
