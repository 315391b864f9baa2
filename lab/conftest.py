"""The lab's tests take the product's shared fixtures (tests/conftest.py: one torch thread, the tiny targets) from
the one place they are defined. ``make lab-test`` runs them; ``make test`` never collects lab/ (testpaths)."""

from tests.conftest import pytest_configure, tiny_assets, tiny_hybrid  # noqa: F401  (fixtures and hook re-exported)
