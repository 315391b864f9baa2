"""The launch dialog's flags field: every flag in view (the text wraps at spaces, a few lines high and
scrolling beyond), where a one-line input showed only the tail of a long command. Enter submits it, as
Enter in the dialog's other fields does; the flags are split as a shell would, so a line break is a space."""

from __future__ import annotations

from textual import events
from textual.message import Message
from textual.widgets import TextArea


class FlagsArea(TextArea):
    DEFAULT_CSS = """
    FlagsArea { height: auto; max-height: 12; }
    """

    class Submitted(Message):
        """Enter was pressed in the field."""

    def __init__(self, text: str = "", **kwargs) -> None:
        super().__init__(text, soft_wrap=True, show_line_numbers=False, **kwargs)

    @property
    def value(self) -> str:
        return self.text

    @value.setter
    def value(self, text: str) -> None:
        self.load_text(text)

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            self.post_message(self.Submitted())
            return
        await super()._on_key(event)
