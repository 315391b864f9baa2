"""Textual apps built on the operator screen's App (console/app.py): several runs with an overview (fleet),
and a record replayed offline (replay)."""
