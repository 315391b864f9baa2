"""The README keeps up with the code: it names every `dflash-console` command and every trainer command
(`python -m trainer.X`; `worker` is the launcher's, not a user's), says that several runs open on the
overview and where the compare view is, and what `make test` costs."""

from __future__ import annotations

import re

from console.cli import build_parser
from tests.support.trainer_run import ROOT

README = (ROOT / "README.md").read_text()


def _commands() -> list[str]:
    return list(build_parser()._subparsers._group_actions[0].choices)


def test_the_readme_names_every_console_command():
    listed = re.search(r"`dflash-console` \(([^)]*)\)", README)
    assert listed, "README: no `dflash-console` (commands) list"
    named = {c.strip() for c in listed.group(1).split(",")}
    assert named == set(_commands()), (named, _commands())


def test_the_readme_names_every_trainer_command():
    mains = sorted(
        p.stem
        for p in (ROOT / "trainer").glob("*.py")
        if '__name__ == "__main__"' in p.read_text() and p.stem != "worker"
    )
    missing = [m for m in mains if f"trainer.{m}" not in README]
    assert not missing, f"README does not name: {missing}"


def test_the_readme_says_where_several_runs_and_the_compare_view_are():
    assert "overview" in README and "compare view" in README
    assert re.search(r"connect [^\n]*--ct 200 --ct 201", README), "README: no connect of several targets"
    assert re.search(r"`make test` then takes about\s+[\d-]+\s+minutes", README), (
        "README: no time for make test"
    )
