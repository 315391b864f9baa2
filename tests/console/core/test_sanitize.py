"""The one sanitiser of text from the container (console/core/sanitize.py) and the bounded JSON decoding
of records: terminal escapes never come out, a 100k-deep line is one bad line, not a RecursionError."""

from __future__ import annotations

import json

from console.core.metrics import MetricsParser
from console.core.sanitize import PLACEHOLDER, BadJson, clean_text, loads
from console.core.streams import LineSplitter
from console.widgets.log_view import LogView

CLIPBOARD = "\x1b]52;c;aGVsbG8=\x1b\\"  # OSC 52: write the operator's clipboard
TITLE = "\x1b]0;pwned\x07"  # OSC 0: set the window title
CSI = "\x1b[2J\x1b[H\x1b[6n"  # clear, home, and ask the terminal to answer (a reply injected as input)
C1 = "\x9b2J\x9d0;t\x9c\x90q\x9c\x85"  # 8-bit CSI, OSC .. ST, DCS .. ST, NEL
HOSTILE = f"a{CLIPBOARD}b{TITLE}c{CSI}d{C1}e"
DEEP = "[" * 100_000 + "]" * 100_000


def unsafe(text: str) -> list[str]:
    """Characters a terminal acts on: C0 but tab and newline, DEL, C1 (ESC is C0)."""
    return [c for c in text if (ord(c) < 32 and c not in "\t\n") or 0x7F <= ord(c) <= 0x9F]


def test_every_escape_sequence_and_control_becomes_one_placeholder():
    out = clean_text(HOSTILE)
    assert not unsafe(out)
    # whole sequences, not just their ESC: no "]52;c;" or "0;pwned" left to read as text
    assert "52;c" not in out and "pwned" not in out and "2J" not in out
    assert out.startswith("a" + PLACEHOLDER + "b" + PLACEHOLDER + "c") and out.endswith("e")
    assert clean_text("tab\tand\nnewline stay, ünïcödé too") == "tab\tand\nnewline stay, ünïcödé too"
    assert clean_text("\x1b[1;31mred\x1b[0m plain") == "red plain"  # colour codes are dropped
    assert clean_text("\x00\x07\x7f\r\udcff") == PLACEHOLDER * 5  # NUL, BEL, DEL, CR, a lone surrogate


BIDI = "\u202e\u2066\u200f\u061c"  # right-to-left override, isolate, mark, Arabic letter mark
ZERO_WIDTH = "\u200b\u200d\u2060\ufeff\u2028"  # zero-width space, joiner, word joiner, BOM, line sep.


def test_bidi_and_zero_width_characters_are_shown_as_escapes():
    """U+202E makes ``gpj.exe`` read ``exe.jpg``; U+200B hides inside a name: both are shown, visibly."""
    out = clean_text(f"run\u202egpj.exe a{ZERO_WIDTH}b {BIDI}")
    assert out == "run\\u202egpj.exe a\\u200b\\u200d\\u2060\\ufeff\\u2028b \\u202e\\u2066\\u200f\\u061c"
    assert clean_text(out) == out  # cleaning twice changes nothing (the log pane cleans again)
    assert clean_text("tag\U000e0041") == "tag\\U000e0041"  # an invisible tag character
    assert clean_text("é ü ⚠ 日本 ⚠️") == "é ü ⚠ 日本 ⚠️"  # visible text, a variation selector: kept
    assert loads('{"k\\u202e": "\\u200b"}') == {"k\\u202e": "\\u200b"}
    (line,) = LineSplitter().feed(f"step {BIDI} done\n".encode())
    assert line == "step \\u202e\\u2066\\u200f\\u061c done"
    assert LogView._process_line(f"x{ZERO_WIDTH}y").startswith("x\\u200b")


def test_log_lines_are_cleaned_of_c1_controls_too():
    out = LineSplitter().feed(f"step 1 {C1} {TITLE}done\n".encode())
    assert len(out) == 1 and not unsafe(out[0]) and out[0].endswith("done")
    # the live pane runs the same sanitiser on whatever it is given
    shown = LogView._process_line(f"x{C1}{CLIPBOARD}y")
    assert not unsafe(shown) and shown.startswith("x") and shown.endswith("y")


def test_a_metrics_field_is_cleaned_where_the_record_is_parsed():
    rec = {"t": 1.0, "kind": "event", "name": "error", "message": HOSTILE, HOSTILE: [HOSTILE]}
    (got,) = MetricsParser().feed(json.dumps(rec).encode() + b"\n")
    assert not unsafe(json.dumps(got, ensure_ascii=False))
    assert got["message"] == clean_text(HOSTILE)


def test_a_100k_deep_line_is_one_bad_line_and_no_record_around_it_is_lost():
    parser = MetricsParser()
    chunk = b"".join(
        [
            json.dumps({"t": 1.0, "kind": "step", "step": 1}).encode() + b"\n",
            DEEP.encode() + b"\n",
            b'{"t": 2.0, "kind": "step", "step": 2, "x": ' + b"[" * 40 + b"]" * 40 + b"}\n",  # too deep
            json.dumps({"t": 3.0, "kind": "step", "step": 3}).encode() + b"\n",
        ]
    )
    assert [r["step"] for r in parser.feed(chunk)] == [1, 3]
    assert parser.bad_lines == 2


def test_loads_raises_one_typed_error_for_everything_wrong():
    cases = [(DEEP, None), ("[" * 900 + "]" * 900, None), (b"\xff\xfe", None), ("{not json", None)]
    for bad, limit in [*cases, ('{"a": "' + "x" * 100 + '"}', 64)]:
        try:
            loads(bad, max_bytes=limit)
        except BadJson:
            continue
        raise AssertionError(f"accepted {bad[:20]!r}")
    assert loads('{"k\\u001b": ["\\u009b"]}') == {"k" + PLACEHOLDER: [PLACEHOLDER]}


def test_the_helpers_copy_of_the_cleaner_is_the_same_cleaner():
    """The helper (which imports nothing from the console) checks a command line the console knows only
    cleaned against /proc through its own copy of the cleaner: it must clean exactly alike."""
    from console.core.helper_program.identity import shown

    corpus = [
        HOSTILE,
        CLIPBOARD,
        TITLE,
        CSI,
        C1,
        "\x1b[1;31mred\x1b[0m",
        "\x1b]0;open",
        "\udcff\x00\x7f",
        "plain",
        BIDI + "x" + ZERO_WIDTH,
        "\U000e0041\u00ad\u2028\u3164",
    ]
    corpus += [chr(c) + "x" + chr(c) for c in range(0xA0)]
    for text in corpus:
        assert shown(text) == clean_text(text), repr(text)


def test_raw_helper_reads_become_text_only_where_the_sanitiser_is():
    """The helper's ``read`` and ``follow`` replies are bytes (base64), the one kind its client does not
    clean. Every module that awaits a ``.read(...)`` or decodes base64 is one that cleans what it turns
    into text (log lines, records, ``remote_files.read_text``) or keeps it as bytes (a local copy): a new
    one must join that list deliberately (stop's ``checkpoints/latest`` reached the terminal raw)."""
    import ast
    from pathlib import Path

    import console

    root = Path(console.__file__).parent
    readers, decoders = set(), set()
    for path in root.rglob("*.py"):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(("core/helper_program/", "devhost/", "demo/")):
            continue  # the helper itself, and the stand-ins of the host
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Await) and isinstance(node.value, ast.Call):
                f = node.value.func
                if isinstance(f, ast.Attribute) and f.attr == "read" and node.value.args:
                    readers.add(rel)
            if isinstance(node, ast.Name) and node.id == "b64decode":
                decoders.add(rel)
    # lines through clean_line / MetricsParser, text through read_text, JSON through loads (helper.py's
    # read_json), bytes to a local file
    cleaning = {
        "core/check.py",
        "core/streams.py",
        "core/remote_files.py",
        "core/transfer.py",
        "core/helper.py",
        "core/deploy.py",  # a deployment's .complete, through sanitize.loads
    }
    assert readers <= cleaning, readers
    assert "core/remote_files.py" in readers  # the scan sees them at all
    assert decoders <= {"core/helper.py", "core/streams.py"}, decoders


def test_a_servers_own_words_in_the_connection_state_are_cleaned():
    """A disconnect reason (an SSH server's, a runtime's) reaches the connection bar and `status`."""
    from console.core.options import ConnectOptions
    from console.core.session import Session

    s = Session(ConnectOptions(host="h"), telemetry=False)
    seen = []
    s.subscribe(seen.append)
    s._state("reconnecting", f"h: lost {TITLE}{C1}\u202e; retrying", 1.0)
    assert not unsafe(seen[-1].detail) and "\u202e" not in seen[-1].detail
    assert seen[-1].detail.startswith("h: lost \ufffd") and "\\u202e" in seen[-1].detail
