"""How the CLI prints JSON for scripts: valid JSON (RFC 8259) always. A value that is not a finite
number (a trainer's NaN loss, an ``inf`` from ``1e999`` in metrics.jsonl) is printed as ``null``, never
as ``NaN`` or ``Infinity``, which strict parsers (jq, JavaScript, Go) refuse; anything else that is
not JSON is its ``str``."""

from __future__ import annotations

import json
import math


def finite(obj: object, _depth: int = 0) -> object:
    """``obj`` with every float that is NaN or infinite replaced by None (bounded: the console's own
    values nest a few levels; deeper ones are left to ``str``)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if _depth > 64:
        return str(obj)
    if isinstance(obj, dict):
        return {k: finite(v, _depth + 1) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v, _depth + 1) for v in obj]
    return obj


def dumps(obj: object, indent: int | None = 1) -> str:
    """``obj`` as JSON text, non-finite numbers as null (see the module)."""
    return json.dumps(finite(obj), indent=indent, default=str, allow_nan=False)
