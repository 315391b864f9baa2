"""Helpers shared by the tests: trainer runs, the in-process SSH host, models, replays, screen text."""
