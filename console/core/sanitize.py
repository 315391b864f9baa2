"""The one cleaner of text that comes out of the container (and of record files), and the bounded
JSON decoding that every record and helper reply goes through.

Whoever can write the run directory, start a process or name a directory in the container chooses
text the console shows. A terminal acts on what it is sent: ``ESC ] 52`` writes the clipboard,
``ESC ] 0`` sets the title, CSI sequences move the cursor or clear the screen, and the 8-bit C1
controls (U+009B is CSI, U+009D is OSC) do the same in one character. So text from outside is
cleaned once, where it enters the core (helper replies, metrics records, log lines, record files),
and every view of it (the screen, every CLI command, a record written from it) shows the same clean
text:

- a whole escape sequence (CSI ``ESC [ ... final``, OSC ``ESC ] ... BEL | ESC \\``, the DCS, SOS,
  PM and APC strings, a two-character ``ESC x``, and their 8-bit C1 forms) becomes one
  :data:`PLACEHOLDER`; colour/style sequences alone (SGR, ``ESC [ 1;31 m``) are dropped, as they
  only colour text and trainer logs (tqdm, transformers) are full of them;
- every other C0 control except tab and newline, DEL, every C1 control (U+0080-U+009F) and a lone
  surrogate (which no terminal can be sent: ``print`` would raise) becomes :data:`PLACEHOLDER`;
- a character that is there but cannot be seen (:data:`INVISIBLE`: the bidi overrides, embeddings,
  isolates and marks, U+202E makes ``exe.txt`` read ``txt.exe``; the zero-width spaces and joiners,
  the BOM, the line and paragraph separators, Hangul fillers, tag characters) is shown as its escape,
  ``\u202e``: visible, and the text reads in the order it is stored.

:func:`loads` decodes one JSON document with a size and a nesting bound (a 100k-deep line raises
no ``RecursionError``) and returns it cleaned; anything wrong is one :class:`BadJson`.
"""

from __future__ import annotations

import json
import re

PLACEHOLDER = "\ufffd"  # U+FFFD REPLACEMENT CHARACTER: what undecodable bytes become too
MAX_DEPTH = 32  # nesting of a metrics record or a helper reply (they use at most 5)

_ST = r"(?:\x07|\x1b\\|\x9c)"  # string terminator: BEL (xterm's OSC), ESC \, or 8-bit ST
_BODY = r"[^\x07\x1b\x80-\x9f]*"  # a string body stops at any control that could start or end one
# Unicode's format characters (category Cf) and the other invisible ones: bidi controls (U+061C,
# U+200E/F, U+202A-E, U+2066-9), zero-width space / joiners / word joiner (U+200B-D, U+2060-4), the
# deprecated format controls (U+206A-F), soft hyphen, the BOM, the line and paragraph separators
# (U+2028/9), Mongolian vowel separator, Hangul fillers, interlinear annotation, tags (U+E0000-7F).
INVISIBLE = (
    "\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f"
    "\u3164\ufeff\uffa0\ufff9-\ufffb\U000e0000-\U000e007f"
)
_SGR = re.compile(r"(?:\x1b\[|\x9b)[0-9;:]*m")
_UNSAFE = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"  # CSI
    rf"|(?:\x1b[\]P^_X]|[\x90\x98\x9d\x9e\x9f]){_BODY}{_ST}"  # OSC, DCS, PM, APC, SOS strings
    r"|\x1b[ -/]*[0-~]"  # a two-character (or intermediate) ESC sequence
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]"  # any other control but TAB and LF: ESC and C1 alone too
    "|[\ud800-\udfff]"  # a lone surrogate (JSON "\\udcff", an fsdecoded byte): unprintable
    f"|[{INVISIBLE}]"  # there but not seen: shown as its escape
)


_INVISIBLE = re.compile(f"[{INVISIBLE}]")


def _shown(m: re.Match) -> str:
    """What a match becomes: an invisible character its escape, anything else the placeholder."""
    c = m.group()
    if not _INVISIBLE.fullmatch(c):
        return PLACEHOLDER
    return f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}"


def clean_text(text: str) -> str:
    """``text`` with every escape sequence and control character (tab and newline kept) replaced by
    :data:`PLACEHOLDER` (colour sequences dropped), and every invisible character by its escape
    (``\\u202e``). Cheap when there is nothing to clean."""
    if text.isascii() and text.isprintable():
        return text
    if "\x1b" in text or "\x9b" in text:
        text = _SGR.sub("", text)
    return _UNSAFE.sub(_shown, text)


class BadJson(ValueError):
    """Not a bounded JSON document: not UTF-8, not JSON, too long, or nested too deep."""


def clean_tree(obj: object, max_depth: int = MAX_DEPTH, _depth: int = 0) -> object:
    """A decoded JSON value with every string (keys too) cleaned; deeper than ``max_depth`` is a
    :class:`BadJson` (so nothing that walks the result later can run out of stack)."""
    if isinstance(obj, str):
        return clean_text(obj)
    if not isinstance(obj, (list, dict)):
        return obj
    if _depth >= max_depth:
        raise BadJson(f"nested deeper than {max_depth} levels")
    d = _depth + 1
    if isinstance(obj, list):  # inline for strings and numbers: a log batch is a list of many lines
        return [
            clean_text(v)
            if type(v) is str
            else clean_tree(v, max_depth, d)
            if isinstance(v, (list, dict))
            else v
            for v in obj
        ]
    return {clean_text(k): clean_tree(v, max_depth, d) for k, v in obj.items()}


# After json.loads a string can hold a control character only where the text is not ASCII, holds a
# DEL, or has a backslash escape that makes one (\u...., \r, \b, \f; \t and \n are kept anyway).
_MAKES_CONTROL = re.compile(r"\\[urbf]")


def _clean_already(text: str, max_depth: int) -> bool:
    """True when json.loads(text) can hold nothing to clean and nest no deeper than ``max_depth``
    (a few C-speed scans; the common case for records and replies)."""
    return (
        text.count("[") + text.count("{") <= max_depth
        and text.isascii()
        and "\x7f" not in text
        and ("\\" not in text or not _MAKES_CONTROL.search(text))
    )


def loads(data: bytes | str, max_bytes: int | None = None, max_depth: int = MAX_DEPTH) -> object:
    """One JSON document from outside, bounded and cleaned (see the module's text); raises
    :class:`BadJson` and nothing else. The nesting bound: json's C decoder gives up at the
    interpreter's recursion limit (~1000 levels, at once: a 100k-deep line costs 2 ms) with a
    RecursionError, caught here; the walk that cleans the result refuses more than ``max_depth``."""
    if max_bytes is not None and len(data) > max_bytes:
        raise BadJson(f"{len(data):,} bytes long (at most {max_bytes:,})")
    try:
        text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
        obj = json.loads(text)
        return obj if _clean_already(text, max_depth) else clean_tree(obj, max_depth)
    except UnicodeDecodeError as e:
        raise BadJson(f"not UTF-8 ({e.reason} at byte {e.start})") from e
    except RecursionError as e:
        raise BadJson(f"nested deeper than {max_depth} levels") from e
    except BadJson:
        raise
    except ValueError as e:  # json.JSONDecodeError
        raise BadJson(str(e)) from e
