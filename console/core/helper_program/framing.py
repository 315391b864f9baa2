"""The helper's framing: one JSON object a line on stdout (``_send``, under one lock: replies come from many
threads), bytes as base64. The first piece of the program (see ``__init__.py``)."""

import base64
import json
import os
import sys
import threading

VERSION = 1
MAX_READ = 1 << 20
MAX_REPLY = 8 << 20  # one answer's line at most; a longer one is answered with a ReplyTooLong error

_out_lock = threading.Lock()


def _send(obj):
    data = (json.dumps(obj, separators=(",", ":")) + "\n").encode("ascii")
    if len(data) > MAX_REPLY and obj.get("id") is not None and "push" not in obj:
        too_long = {
            "id": obj["id"],
            "ok": False,
            "error": f"{len(data) / 2**20:.1f} MiB long, over the helper's limit of {MAX_REPLY >> 20} MiB",
            "kind": "ReplyTooLong",
        }
        data = (json.dumps(too_long, separators=(",", ":")) + "\n").encode("ascii")
    try:
        with _out_lock:
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
    except (BrokenPipeError, OSError, ValueError):
        os._exit(0)


def _b64(data):
    return base64.b64encode(data).decode("ascii")


def _unb64(text):
    return base64.b64decode(text.encode("ascii"))
