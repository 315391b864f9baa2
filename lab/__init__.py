"""The lab: answered research, kept runnable beside the product but never part of it (lab/README.md).

A package so that its modules import each other as ``lab.X`` and import-linter can hold the product to never
importing it (pyproject.toml). Not in the wheel (packages.find includes console* and trainer* only)."""
