"""How the console writes numbers for people: durations, ages, sizes, tok/s, a missing value.

One place for the screen's widgets, the view model, ``status`` and the demo's status line.
"""

from __future__ import annotations


def fmt_duration(s: float | None) -> str:
    """12s, 3m05s, 2h07m, 3d04h; '-' for unknown."""
    if s is None:
        return "-"
    s = int(round(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def fmt_age(t: object, now: float) -> str:
    """How long ago unix time ``t`` was: '12 s ago', '3 min ago', '1.5 h ago'; '?' for no time."""
    if not isinstance(t, (int, float)):
        return "?"
    s = max(0.0, now - float(t))
    if s < 90:
        return f"{s:.0f} s ago"
    if s < 5400:
        return f"{s / 60:.0f} min ago"
    return f"{s / 3600:.1f} h ago"


def fmt_tok_s(v: float | None) -> str:
    """812, 14.5K; '-' for unknown."""
    if v is None:
        return "-"
    if v >= 10_000:
        return f"{v / 1000:.1f}K"
    return f"{v:.0f}"


def fmt_bytes(n: object) -> str:
    """512 B, 2.0 KB, 3.4 MB, 1.2 GB (powers of 1024); '?' when not a number."""
    if not isinstance(n, (int, float)) or isinstance(n, bool):
        return "?"
    n = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def fmt_gpu_memory(used_mib: float | None, total_mib: float | None) -> str:
    """A GPU's memory as nvidia-smi reports it (MiB), shown in GiB: 98.8/140G, 37.5G; '-' for unknown."""
    if used_mib is None:
        return "-"
    return f"{used_mib / 1024:.1f}/{total_mib / 1024:.0f}G" if total_mib else f"{used_mib / 1024:.1f}G"


def fmt_number(v: object, spec: str, unit: str = "") -> str:
    """``format(v, spec) + unit`` for a number; '-' for anything else (None, a missing field)."""
    if not isinstance(v, (int, float)):
        return "-"
    return format(v, spec) + unit
