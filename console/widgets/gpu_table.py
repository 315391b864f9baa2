"""GPU table: one row per GPU (and per trainer device without a GPU), joined to the trainer's roles.

Drawn as fixed-width text lines (no DataTable): it changes twice a second with 8 GPUs, and a
DataTable re-renders every touched cell through Rich padding, which showed up in the bench.
"""

from __future__ import annotations

from rich.text import Text

from console.core.formatting import fmt_gpu_memory, fmt_number, fmt_tok_s
from console.core.state import ConsoleState, DeviceRow
from console.widgets.liveness import rates_live
from console.widgets.text_widget import TextWidget

# (header, width, right-aligned)
COLUMNS = (
    ("GPU", 4, False),
    ("name", 9, False),
    ("role", 8, False),
    ("util", 5, True),
    ("memory", 11, True),
    ("power", 6, True),
    ("temp", 5, True),
    ("tok/s", 7, True),
)
ROLE_STYLE = {"drafter": "bold cyan", "target": "bold magenta"}


def _pct_style(v: float | None) -> str:
    if v is None:
        return "dim"
    return "green" if v >= 80 else "yellow" if v >= 30 else "red"


def row_cells(r: DeviceRow, live: bool = True) -> list[tuple[str, str]]:
    """(text, style) per column; tok/s blank unless ``live`` (a trainer running past its start-up)."""
    name = r.name.removeprefix("NVIDIA ") if r.name else (r.host or r.device or "")
    return [
        (r.label, "bold"),
        (name, ""),
        (r.role or "-", ROLE_STYLE.get(r.role or "", "dim")),
        (fmt_number(r.util, ".0f", "%"), _pct_style(r.util)),
        (fmt_gpu_memory(r.mem_used, r.mem_total), ""),
        (fmt_number(r.power, ".0f", "W"), ""),
        (fmt_number(r.temp, ".0f", "°C"), ""),
        (fmt_tok_s(r.tok_s if live else None), "bold" if r.role == "drafter" and live else ""),
    ]


def _cell(text: str, width: int, right: bool) -> str:
    text = text if len(text) <= width else text[: width - 1] + "…"
    return text.rjust(width) if right else text.ljust(width)


def table_text(rows: list[DeviceRow], live: bool = True) -> Text:
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(" ".join(_cell(h, w, right) for h, w, right in COLUMNS), style="bold dim")
    for r in rows:
        t.append("\n")
        for i, ((text, style), (_, width, right)) in enumerate(zip(row_cells(r, live), COLUMNS, strict=True)):
            if i:
                t.append(" ")
            t.append(_cell(text, width, right), style=style)
    if not rows:
        t.append("\nno GPUs or trainer devices yet", style="dim")
    return t


class GpuTable(TextWidget):
    DEFAULT_CSS = "GpuTable { height: auto; max-height: 12; padding: 0 1; }"

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._n_rows = -1

    def update_from(self, state: ConsoleState) -> None:
        rows = state.rows()
        grew = len(rows) != self._n_rows  # only a new row count needs a layout pass
        self._n_rows = len(rows)
        self.set_content(table_text(rows, rates_live(state)), layout=grew)

    def cells(self) -> list[list[str]]:
        """The table as text cells, row by row (header excluded)."""
        lines = self._content.plain.split("\n")[1:]
        out = []
        for line in lines:
            cells, x = [], 0
            for _, width, _ in COLUMNS:
                cells.append(line[x : x + width].strip())
                x += width + 1
            out.append(cells)
        return out
