"""What the terminal shows, as text: the current screen's composited lines (test helper)."""


def screen_text(app) -> str:
    strips = app.screen._compositor.render_strips()
    return "\n".join(s.text.rstrip() for s in strips)
