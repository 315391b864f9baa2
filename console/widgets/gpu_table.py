"""GPU table: one row per GPU (and per trainer device without a GPU), joined to the trainer's roles."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

from console.core.state import ConsoleState, DeviceRow, fmt_tok_s

COLUMNS = ("GPU", "name", "role", "util", "memory", "power", "temp", "tok/s")
ROLE_STYLE = {"drafter": "bold cyan", "target": "bold magenta"}


def _pct(v: float | None) -> Text:
    if v is None:
        return Text("-", justify="right")
    style = "green" if v >= 80 else "yellow" if v >= 30 else "red"
    return Text(f"{v:.0f}%", style=style, justify="right")


def _mem(used: float | None, total: float | None) -> Text:
    """nvidia-smi reports MiB; shown in GiB."""
    if used is None:
        return Text("-", justify="right")
    s = f"{used / 1024:.1f}"
    if total:
        s += f"/{total / 1024:.0f}G"
    else:
        s += "G"
    return Text(s, justify="right")


def _num(v: float | None, unit: str) -> Text:
    return Text("-" if v is None else f"{v:.0f}{unit}", justify="right")


def row_cells(r: DeviceRow) -> tuple:
    name = r.name.removeprefix("NVIDIA ") if r.name else (r.device or "")
    role = Text(r.role or "-", style=ROLE_STYLE.get(r.role or "", "dim"))
    tok = Text(fmt_tok_s(r.tok_s), justify="right",
               style="bold" if r.role == "drafter" else "")
    return (r.label, name[:18], role, _pct(r.util), _mem(r.mem_used, r.mem_total),
            _num(r.power, "W"), _num(r.temp, "°C"), tok)


class GpuTable(DataTable):
    """The GPU table. Rows are rebuilt only when the set of devices changes; cells update in place."""

    DEFAULT_CSS = """
    GpuTable { height: auto; max-height: 12; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(cursor_type="none", zebra_stripes=True, show_cursor=False, **kwargs)
        self._keys: list[str] = []
        self._plain: list[list[str]] = []

    def on_mount(self) -> None:
        for c in COLUMNS:
            self.add_column(c, key=c)

    def update_from(self, state: ConsoleState) -> None:
        rows = state.rows()
        keys = [f"{i}|{r.label}|{r.uuid}|{r.device}|{r.role}" for i, r in enumerate(rows)]
        cells = [row_cells(r) for r in rows]
        plain = [[str(v) for v in c] for c in cells]
        if keys != self._keys:
            self.clear()
            for k, c in zip(keys, cells, strict=True):
                self.add_row(*c, key=k)
            self._keys, self._plain = keys, plain
            return
        for y, c in enumerate(cells):
            for x, v in enumerate(c):
                if plain[y][x] != self._plain[y][x]:
                    self.update_cell_at((y, x), v)
        self._plain = plain
