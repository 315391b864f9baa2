"""``python -m trainer.regenerate`` against a real OpenAI-compatible HTTP server on 127.0.0.1 serving the tiny
target's real generations, with 500s, timeouts, dropped and cut connections, a kill and a resume."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.support.trainer_run import ROOT, env
from trainer.regeneration import client, command, store

NEW = 8


def chats(n: int) -> list[dict]:
    out = []
    for i in range(n):
        msgs = [{"role": "user", "content": f"count from {i} by {1 + i % 2}"}]
        if i % 3 == 2:  # a multi-turn conversation with a system prompt
            msgs = [{"role": "system", "content": "ok"}, *msgs, {"role": "assistant", "content": "ok"}]
            msgs.append({"role": "user", "content": f"repeat {i} {i + 1}"})
        msgs.append({"role": "assistant", "content": "the data's own reply, replaced"})
        out.append({"messages": msgs})
    return out


def write_input(path, recs) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    return str(path)


def flags(inp: str, out, url: str, *extra: str) -> list[str]:
    return ["--input", inp, "--output", str(out), "--endpoint", url, "--model", "tiny",
            "--max-tokens", str(NEW), "--retries", "4", "--backoff", "0.02", "--timeout", "5",
            "--thinking", "off", "--progress-every", "0", *extra]  # fmt: skip


def lines(out) -> list[str]:
    return (out / store.OUTPUT).read_text(encoding="utf-8").splitlines()


def test_faults_are_retried_and_every_response_is_the_targets(server, target, tmp_path):
    recs = chats(9)
    ids = [r["messages"][-2]["content"] for r in recs]
    server.faults = {ids[0]: ["500", "500"], ids[1]: ["sleep"], ids[3]: ["drop"], ids[4]: ["cut", "500"]}
    out = tmp_path / "out"
    rc = command.main(flags(write_input(tmp_path / "in.jsonl", recs), out, server.url, "--concurrency", "3"))
    assert rc == 0
    assert not (out / store.FAILURES).exists()
    got = [json.loads(x) for x in lines(out)]
    assert len(got) == len(recs) and len({g["key"] for g in got}) == len(recs)
    for rec, g in zip(recs, got, strict=True):  # input order; the prompt kept, the reply the target's own
        prompt = rec["messages"][:-1]
        assert g["messages"][:-1] == prompt
        want, finish, _ = target.answer({"messages": prompt, "max_tokens": NEW})
        assert g["messages"][-1] == {"role": "assistant", "content": want}
        assert g["finish_reason"] == finish
    assert [server.attempts[i] for i in ids[:5]] == [3, 2, 1, 2, 3]
    assert all(b["chat_template_kwargs"] == {"enable_thinking": False} for b in server.bodies)
    assert all(b["temperature"] == 0 and b["max_tokens"] == NEW for b in server.bodies)


def test_output_is_what_prepare_reads(server, tiny_assets, tmp_path):
    from transformers import AutoTokenizer

    from trainer.data.tokenizing import prepare

    out = tmp_path / "out"
    assert command.main(flags(write_input(tmp_path / "in.jsonl", chats(4)), out, server.url)) == 0
    tok = AutoTokenizer.from_pretrained(str(tiny_assets / "target"), local_files_only=True)
    stats = prepare(tok, [str(out / store.OUTPUT)], str(tmp_path / "data"))
    trained = [json.loads(x) for x in (tmp_path / "data" / "part-00000.jsonl").read_text().splitlines()]
    assert stats["sequences"] == 4
    for rec, row in zip([json.loads(x) for x in lines(out)], trained, strict=True):
        replies = " ".join(m["content"] for m in rec["messages"] if m["role"] == "assistant")
        masked = [t for t, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m]
        assert tok.decode(masked, skip_special_tokens=True).split() == replies.split()  # every reply trained


@pytest.mark.e2e
def test_a_killed_run_resumes_to_the_uninterrupted_output(server, tmp_path):
    inp = write_input(tmp_path / "in.jsonl", chats(10) + chats(2))  # the last two: repeats, own results
    ref, cut = tmp_path / "ref", tmp_path / "cut"
    assert command.main(flags(inp, ref, server.url, "--concurrency", "3")) == 0
    server.serve_limit, server.served = 4, 0
    server.gate.clear()
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer.regenerate", *flags(inp, cut, server.url, "--concurrency", "1")],
        cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not ((cut / store.OUTPUT).exists() and len(lines(cut)) >= 4):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"no 4 results on disk: {proc.communicate(timeout=30)[1].decode()[-2000:]}")
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
        proc.stderr.close()
    assert len(lines(cut)) == 4
    with open(cut / store.OUTPUT, "a", encoding="utf-8") as f:
        f.write('{"key": "a line cut by the kill')  # as if killed mid-write
    server.serve_limit = None
    server.gate.set()
    assert command.main(flags(inp, cut, server.url, "--concurrency", "3")) == 0
    assert (cut / store.OUTPUT).read_bytes() == (ref / store.OUTPUT).read_bytes()
    assert len(lines(ref)) == 12
    assert command.main(flags(inp, cut, server.url)) == 0  # nothing left: nothing asked, nothing added
    assert (cut / store.OUTPUT).read_bytes() == (ref / store.OUTPUT).read_bytes()


def test_failed_prompts_are_listed_and_the_exit_status_says_so(server, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(client, "MAX_REPLY", 2**20)  # the "huge" reply is 4 MB
    recs = chats(8)
    ids = [r["messages"][-2]["content"] for r in recs]
    server.always = {ids[2]: "500"}
    server.faults = {ids[4]: ["400"], ids[5]: ["garbage"], ids[6]: ["nested"], ids[7]: ["huge"]}
    inp, out = write_input(tmp_path / "in.jsonl", recs), tmp_path / "out"
    assert command.main(flags(inp, out, server.url, "--retries", "2")) == 1
    fails = [json.loads(x) for x in (out / store.FAILURES).read_text().splitlines()]
    assert [f["index"] for f in fails] == [2, 4, 5, 6, 7]
    assert "HTTP 500" in fails[0]["error"] and "3 attempts" in fails[0]["error"]
    assert "HTTP 400" in fails[1]["error"] and "not a string" in fails[2]["error"]
    assert "not JSON" in fails[3]["error"] and "larger than" in fails[4]["error"]
    assert [server.attempts[ids[i]] for i in (2, 4, 5, 6, 7)] == [3, 1, 1, 1, 1]  # only transient: retried
    assert len(lines(out)) == 3
    err = capsys.readouterr().err
    assert "5 prompt(s) failed (input indices [2, 4, 5, 6, 7])" in err
    assert re.search(
        r"regenerate: 8/8 \(100\.0%\) [0-9.]+/s [0-9,]+ tok/s, ETA 0s, failed 5", err
    )  # progress
    server.always = {}
    assert command.main(flags(inp, out, server.url)) == 0  # the rerun retries exactly the failed ones
    assert not (out / store.FAILURES).exists()
    keys = [json.loads(x)["key"] for x in lines(out)]
    assert len(keys) == 8 == len(set(keys))


def test_completions_endpoint_and_changed_settings(server, target, tmp_path, monkeypatch):
    recs = [{"prompt": f"count from {i} by 2"} for i in range(3)]
    inp, out = write_input(tmp_path / "in.jsonl", recs), tmp_path / "out"
    monkeypatch.setenv("REGEN_TEST_KEY", "k-123")
    assert (
        command.main(flags(inp, out, server.url, "--mode", "completion", "--api-key-env", "REGEN_TEST_KEY"))
        == 0
    )
    assert server.auth == ["Bearer k-123"] * 3
    got = [json.loads(x) for x in lines(out)]
    for rec, g in zip(recs, got, strict=True):
        assert g["prompt"] == rec["prompt"]
        assert g["completion"] == target.answer({"prompt": rec["prompt"], "max_tokens": NEW})[0]
    assert all("messages" not in b for b in server.bodies)
    changed = flags(inp, out, server.url, "--mode", "completion", "--temperature", "0.7")
    assert command.main(changed) == 2  # another generation is not mixed into this directory
    assert len(lines(out)) == 3
