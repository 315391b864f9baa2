"""Where the trainer lives (console/core/place.py): the exec prefix, the names, the one parser of the
CLI's ``--ct`` and the config file's ``container``."""

from __future__ import annotations

import shlex

import pytest

from console.core.config_file import ConfigError
from console.core.options import ConnectOptions
from console.core.place import (
    HOST,
    Host,
    PlaceError,
    Proxmox,
    from_config,
    from_flags,
    from_json,
    parse,
    to_json,
)
from console.core.targets import Target, targets_from_config

HOSTILE = ["python3", "-c", "print('x'); $(rm -rf /) `id` \"q\" \\ ;|&", "a b", "", "--", "\n", "ü"]


def test_the_host_runs_argv_as_it_is():
    assert HOST.wrap(["nvidia-smi", "-L"]) == ["nvidia-smi", "-L"]
    assert shlex.split(HOST.command(HOSTILE)) == HOSTILE
    assert Host() == HOST and hash(Host()) == hash(HOST)


def test_a_container_runs_argv_through_pct_exec():
    p = Proxmox(200)
    assert p.wrap(["nvidia-smi", "-L"]) == ["pct", "exec", "200", "--", "nvidia-smi", "-L"]
    assert shlex.split(p.command(HOSTILE)) == ["pct", "exec", "200", "--", *HOSTILE]
    argv = ["x"]
    p.wrap(argv)
    assert argv == ["x"]  # the caller's list is left alone


def test_names_on_the_screen_in_the_cli_and_in_errors():
    assert (HOST.label, HOST.describe, HOST.short) == ("", "the host", "")
    assert (Proxmox(200).label, Proxmox(200).describe, Proxmox(200).short) == (
        "CT 200",
        "container 200",
        "200",
    )
    assert Proxmox(200).at("h1") == "h1 · CT 200" and HOST.at("h1") == "h1"
    assert Proxmox(200).at("h1", " ") == "h1 CT 200"
    opts = ConnectOptions.from_target("root@h1")
    assert Target("t", opts, Proxmox(201)).where == "h1 · CT 201" and Target("t", opts).where == "h1"


def test_keys_tell_places_apart():
    assert Proxmox(200).key == Proxmox(200).key != Proxmox(201).key != HOST.key
    assert len({Proxmox(200), Proxmox(200), HOST, Host()}) == 2
    assert Proxmox(200) != HOST


def test_flags_and_config_entries_go_through_one_parser():
    assert parse("--ct", 200) == Proxmox(200) == parse("container", 200)
    assert from_flags({"ct": [200, 201], "port": 22}) == [Proxmox(200), Proxmox(201)]
    assert from_flags({"ct": None}) == [] and from_flags({}) == []
    assert from_config({"host": "h", "container": 200}) == Proxmox(200)
    assert from_config({"host": "h"}) == HOST


def test_a_place_round_trips_through_config_flags_and_json():
    for p in (HOST, Proxmox(200)):
        assert from_config(p.config()) == p
        assert from_json(to_json(p)) == p
    assert Proxmox(200).config() == {"container": 200} and HOST.config() == {}
    assert Proxmox(200).flags() == ["--ct", "200"] and HOST.flags() == []
    assert to_json(Proxmox(200)) == {"ct": 200} and to_json(HOST) == {"ct": None}  # status --json


@pytest.mark.parametrize(
    "name, value, says",
    [
        ("container", "200", "container must be a int, not '200'"),
        ("container", True, "container must be a int, not True"),
        ("--ct", 2.0, "--ct must be a int, not 2.0"),
        ("--ct", "200; rm -rf /", "--ct must be a int"),
        ("lxc", "x", "lxc names no place"),
    ],
)
def test_a_wrong_value_is_refused_and_named(name, value, says):
    with pytest.raises(PlaceError) as e:
        parse(name, value)
    assert says in str(e.value)


def test_a_place_cannot_be_built_from_a_wrong_value():
    for bad in ("200", True, None, 2.5):
        with pytest.raises(PlaceError, match="container must be a int"):
            Proxmox(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["200", True, False, 1.5, [200]])
def test_the_config_files_container_is_checked_with_the_files_name(value):
    with pytest.raises(ConfigError, match="container must be a int") as e:
        targets_from_config({"targets": {"x": {"host": "h", "container": value}}}, "/cfg.toml")
    assert str(e.value).startswith("/cfg.toml: [targets.x] container must be a int")
