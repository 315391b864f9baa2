"""A widget that shows one Rich renderable and repaints only when it changed, without a layout pass.

``Static.update`` asks for a layout refresh on every call; the screen's panels change several times
a second but never their size, so that cost is avoided here (the size comes from CSS).
"""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget


class TextWidget(Widget):
    DEFAULT_CSS = "TextWidget { text-wrap: nowrap; text-overflow: ellipsis; }"

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._content: Text = Text()

    def set_content(self, content: Text, layout: bool = False) -> bool:
        """Show ``content``; returns whether anything changed (and so was repainted)."""
        if content == self._content:
            return False
        self._content = content
        self.refresh(layout=layout)
        return True

    def render(self) -> Text:
        return self._content
