"""``trainer.prepare`` and a user's mistakes (issue 54, items 5-7): a tokenizer that does not fit the text, a
used ``--output-dir``, a wrong ``--tokenizer`` or ``--input`` path, a role typo. Each is one line on stderr and
exit status 2, with nothing of the run left behind (the tiny target's word-level tokenizer, in process)."""

from __future__ import annotations

import json

import pytest

from trainer.data.tokenizing import main

CHAT = {"messages": [{"role": "user", "content": "repeat 1 2"}, {"role": "assistant", "content": "1 2 1 2"}]}
ENGLISH = {"text": "The quick brown fox jumps over the lazy dog"}  # words outside the tiny vocabulary


def _raw(tmp_path, records, name="in.jsonl"):
    raw = tmp_path / name
    raw.write_text("".join(json.dumps(r) + "\n" for r in records))
    return raw


def _prepare(capsys, tiny_assets, raw, out, *flags) -> tuple[int, dict | None, str]:
    argv = ["--tokenizer", str(tiny_assets / "target"), "--input", str(raw), "--output-dir", str(out), *flags]
    rc = main(argv)
    cap = capsys.readouterr()
    return rc, json.loads(cap.out) if rc == 0 else None, cap.err


def _one_line_error(err: str, *parts: str) -> None:
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    for p in parts:
        assert p in err, err


def _files(d) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*")) if d.exists() else []


def test_a_tokenizer_that_does_not_fit_the_text_is_refused_and_reported(tiny_assets, tmp_path, capsys):
    raw = _raw(tmp_path, [ENGLISH] * 3 + [{"text": "1 2 3"}])
    out = tmp_path / "data"
    rc, _, err = _prepare(capsys, tiny_assets, raw, out, "--heldout-fraction", "0.5")
    _one_line_error(err, "tokenizer's unknown token '[UNK]'", "refused above 5%", "--allow-unk")
    assert _files(out) == []  # nothing written is left
    rc, stats, err = _prepare(capsys, tiny_assets, raw, out, "--allow-unk")
    assert rc == 0, err
    lines = [json.loads(x) for x in (out / "part-00000.jsonl").read_text().splitlines()]
    unk = sum(x["input_ids"].count(3) for x in lines)  # "[UNK]" is id 3 in the tiny vocabulary
    assert stats["unk_token"] == "[UNK]" and stats["unk_tokens"] == unk == sum(x["unk"] for x in lines)
    assert stats["unk_share"] == pytest.approx(unk / stats["tokens"], abs=1e-6) and stats["unk_share"] > 0.5
    assert main(["--report", str(out), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)["unknown_tokens"]
    assert rep["unk"] == unk and rep["share"] == pytest.approx(stats["unk_share"], abs=1e-6)
    assert main(["--report", str(out)]) == 0
    assert f"unknown tokens: {unk} of {stats['tokens']} (" in capsys.readouterr().out


def test_text_the_tokenizer_fits_has_no_unknown_tokens(tiny_assets, tmp_path, capsys):
    rc, stats, err = _prepare(capsys, tiny_assets, _raw(tmp_path, [CHAT]), tmp_path / "data")
    assert rc == 0, err
    assert stats["unk_tokens"] == 0 and stats["unk_share"] == 0


def test_a_used_output_dir_is_refused_and_overwrite_leaves_no_old_heldout(tiny_assets, tmp_path, capsys):
    raw = _raw(tmp_path, [{"messages": [*CHAT["messages"][:1], {"role": "assistant", "content": f"{k} 1"}]}
                          for k in range(40)])  # fmt: skip
    out = tmp_path / "data"
    rc, first, err = _prepare(capsys, tiny_assets, raw, out, "--heldout-fraction", "0.5")
    assert rc == 0 and first["heldout_sequences"] > 0, err
    before = {p: (out / p).read_bytes() for p in _files(out) if (out / p).is_file()}
    rc, _, err = _prepare(capsys, tiny_assets, raw, out)
    _one_line_error(err, f"--output-dir: {str(out)!r} is not empty", "--overwrite")
    assert {p: (out / p).read_bytes() for p in before} == before  # untouched
    (out / "NOTES.txt").write_text("mine")
    rc, second, err = _prepare(capsys, tiny_assets, raw, out, "--overwrite")
    assert rc == 0, err
    # the old heldout/ is gone, the user's file kept; prepare.json says how this output was rendered
    assert _files(out) == ["NOTES.txt", "part-00000.jsonl", "prepare.json"]
    assert second["sequences"] == 40
    rc, _, err = _prepare(capsys, tiny_assets, _raw(tmp_path, [ENGLISH], "english.jsonl"), out, "--overwrite")
    assert rc == 2 and _files(out) == ["NOTES.txt"]  # no record left of data that is gone


def test_overwrite_removes_only_what_prepare_wrote_and_follows_no_link(tiny_assets, tmp_path, capsys):
    raw = _raw(tmp_path, [CHAT])
    out, elsewhere = tmp_path / "data", tmp_path / "elsewhere"
    (out / "heldout").mkdir(parents=True)
    elsewhere.mkdir()
    (elsewhere / "part-00000.jsonl").write_text("{}\n")
    (out / "part-00007.jsonl").symlink_to(elsewhere / "part-00000.jsonl")  # a link is never prepare's
    rc, _, err = _prepare(capsys, tiny_assets, raw, out, "--overwrite")
    _one_line_error(err, "part-00007.jsonl", "not written by prepare")
    assert (out / "part-00007.jsonl").is_symlink() and (elsewhere / "part-00000.jsonl").read_text() == "{}\n"
    (out / "part-00007.jsonl").unlink()
    (out / "heldout").rmdir()
    (out / "heldout").symlink_to(elsewhere)
    rc, _, err = _prepare(capsys, tiny_assets, raw, out, "--overwrite")
    _one_line_error(err, "heldout", "symbolic link")
    assert _files(elsewhere) == ["part-00000.jsonl"]
    (out / "heldout").unlink()
    (out / "mine.jsonl").write_text('{"input_ids": [1, 2]}\n')  # the trainer would read it with the new data
    rc, _, err = _prepare(capsys, tiny_assets, raw, out, "--overwrite")
    _one_line_error(err, "mine.jsonl", "not written by prepare")
    assert _files(out) == ["mine.jsonl"]


def test_a_wrong_tokenizer_or_input_path_is_one_line(tiny_assets, tmp_path, capsys):
    raw = _raw(tmp_path, [CHAT])
    out = tmp_path / "data"
    missing = tmp_path / "no-such-model"
    assert main(["--tokenizer", str(missing), "--input", str(raw), "--output-dir", str(out)]) == 2
    _one_line_error(capsys.readouterr().err, f"--tokenizer: {str(missing)!r} is not a directory")
    empty = tmp_path / "empty-model"
    empty.mkdir()
    assert main(["--tokenizer", str(empty), "--input", str(raw), "--output-dir", str(out)]) == 2
    _one_line_error(capsys.readouterr().err, f"--tokenizer: no tokenizer could be read from {str(empty)!r}")
    rc, _, err = _prepare(capsys, tiny_assets, tmp_path / "nope.jsonl", out)
    _one_line_error(err, f"--input: {str(tmp_path / 'nope.jsonl')!r}: no such file")
    rc, _, err = _prepare(capsys, tiny_assets, tmp_path, out)
    _one_line_error(err, "is not a file")
    assert not out.exists()


def test_a_role_typo_is_refused_naming_file_line_and_message(tiny_assets, tmp_path, capsys):
    typo = {"messages": [{"role": "user", "content": "repeat 1 2"}, {"role": "assistent", "content": "1 2"}]}
    raw = _raw(tmp_path, [CHAT, typo])
    rc, _, err = _prepare(capsys, tiny_assets, raw, tmp_path / "data")
    assert rc == 2
    _one_line_error(err, f"{raw}:2: message 2: unknown role 'assistent'")
    assert not (tmp_path / "data").exists()  # the first line's output is not left behind


def test_a_torn_input_line_points_at_its_column(tiny_assets, tmp_path, capsys):
    raw = tmp_path / "in.jsonl"
    raw.write_text(json.dumps(CHAT) + '\n{"text": "1 2 3 4 5\n')  # the second write cut short
    rc, _, err = _prepare(capsys, tiny_assets, raw, tmp_path / "data")
    assert rc == 2
    _one_line_error(err, f"{raw}:2:20: not valid JSON (", "at column 20, where the line ends")


def test_a_wrong_tokenizer_stops_early_on_a_large_input(tiny_assets, tmp_path, capsys, monkeypatch):
    from trainer.data import unknown_tokens

    monkeypatch.setattr(unknown_tokens, "EARLY_TOKENS", 20)  # stands for the first 100,000 tokens
    raw = _raw(tmp_path, [ENGLISH] * 5 + [CHAT] * 200)  # the whole input would pass the 5% limit
    rc, _, err = _prepare(capsys, tiny_assets, raw, tmp_path / "data")
    _one_line_error(err, "of the first ", "unknown token '[UNK]'")
    assert not (tmp_path / "data").exists()
