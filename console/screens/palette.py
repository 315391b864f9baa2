"""Command palette provider: the console's actions by name (ctrl+p), minus the changing ones when
read-only. The app supplies the list, so keys, help and palette never disagree."""

from __future__ import annotations

from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider


class ConsoleCommands(Provider):
    def _commands(self):
        app = self.app
        return [
            (title, help_, partial(app.run_action, action)) for action, title, help_ in app.palette_commands()
        ]

    async def discover(self) -> Hits:
        for title, help_, cb in self._commands():
            yield DiscoveryHit(title, cb, help=help_)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for title, help_, cb in self._commands():
            score = matcher.match(title)
            if score > 0:
                yield Hit(score, matcher.highlight(title), cb, help=help_)
