"""Test-only: a trainer started with this folder on its PYTHONPATH gets the faults its environment asks for
(tests/support/faults.py). Nothing outside the tests puts this folder on a path."""

import importlib.util
import os

_spec = importlib.util.spec_from_file_location(
    "dflash_test_faults",
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "faults.py"),
)
_faults = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_faults)
_faults.install(os.environ)
