"""Where the trainer lives (console/core/place.py): the exec prefix, the names, the one parser of the
CLI's ``--ct`` and the config file's ``container``."""

from __future__ import annotations

import shlex

import pytest

from console.core.config_file import ConfigError
from console.core.options import ConnectOptions
from console.core.place import (
    HOST,
    Docker,
    Host,
    Kubernetes,
    Lxc,
    PlaceError,
    Podman,
    Proxmox,
    Slurm,
    dest,
    from_config,
    from_flags,
    from_json,
    parse,
    to_json,
)
from console.core.targets import Target, targets_from_config

RUNTIMES = [
    Proxmox(200),
    Lxc("ct1"),
    Lxc("/srv/lxc/ct1"),
    Docker("train"),
    Docker("bob@gpu-box/train"),
    Podman("train"),
    Podman("1000@remote/train"),
    Kubernetes("p0"),
    Kubernetes("ml/p0:trainer"),
    Slurm("1234"),
    Slurm("dflash"),
]
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
    nones = {"ct": None, "lxc": None, "docker": None, "podman": None, "pod": None, "slurm": None}
    assert to_json(Proxmox(200)) == {**nones, "ct": 200} and to_json(HOST) == nones  # status --json
    for p in RUNTIMES:
        assert from_config(p.config()) == p and from_json(to_json(p)) == p
        assert from_flags({dest(p.flags()[0]): [p.value]}) == [p]


@pytest.mark.parametrize(
    "name, value, says",
    [
        ("container", "200", "container must be a int, not '200'"),
        ("container", True, "container must be a int, not True"),
        ("--ct", 2.0, "--ct must be a int, not 2.0"),
        ("--ct", "200; rm -rf /", "--ct must be a int"),
        ("lxd", "x", "lxd names no place"),
        ("docker", 5, "docker must be a str"),
        ("--docker", "-it", "container '-it' is not a name"),
        ("--docker", "bob@ctx/", "container '' is not a name"),
        ("--podman", "a b", "container 'a b' is not a name"),
        ("--lxc", "rel/path/ct1", "must be absolute"),
        ("--pod", "ns/-x:c", "pod '-x' is not a name"),
        ("--pod", "ns/p:--all", "container '--all' is not a name"),
        ("--slurm", "12;34", "job '12;34' is not a name"),
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


@pytest.mark.parametrize(
    "place, prefix",
    [
        (Lxc("ct1"), ["lxc-attach", "-n", "ct1", "--"]),
        (Lxc("/srv/lxc/ct1"), ["lxc-attach", "-n", "ct1", "-P", "/srv/lxc", "--"]),
        (Docker("train"), ["docker", "exec", "-i", "train"]),
        (Docker("bob@gpu-box/train"), ["docker", "--context", "gpu-box", "exec", "-i", "-u", "bob", "train"]),
        (
            Podman("1000@remote/train"),
            ["podman", "--connection", "remote", "exec", "-i", "-u", "1000", "train"],
        ),
        (Kubernetes("p0"), ["kubectl", "exec", "-i", "p0", "--"]),
        (Kubernetes("ml/p0:trainer"), ["kubectl", "exec", "-i", "-n", "ml", "p0", "-c", "trainer", "--"]),
        (Slurm("1234"), ["srun", "--jobid=1234", "--overlap", "-N1", "-n1", "--relative=0", "--quiet"]),
    ],
)
def test_each_runtime_runs_argv_through_its_exec_prefix(place, prefix):
    assert place.wrap(["nvidia-smi", "-L"]) == [*prefix, "nvidia-smi", "-L"]
    assert shlex.split(place.command(HOSTILE)) == [*prefix, *HOSTILE]  # one shell, and argv intact


def test_a_slurm_job_by_name_is_looked_up_and_argv_never_meets_the_shells_parser():
    argv = Slurm("dflash").wrap(HOSTILE)
    assert argv[:2] == ["sh", "-c"] and argv[3:] == ["dflash", *HOSTILE]  # "$0" is the name, "$@" the argv
    assert "squeue -h -n" in argv[2] and 'exec srun --jobid="$j" --overlap' in argv[2]
    assert '|| exec "$@"' in argv[2]  # no job running: the host itself (the login node)


def test_each_runtime_is_named_on_screen_and_its_key_tells_it_apart():
    labels = [p.at("h1") for p in RUNTIMES]
    assert labels[:4] == ["h1 · CT 200", "h1 · LXC ct1", "h1 · LXC /srv/lxc/ct1", "h1 · docker train"]
    assert Kubernetes("ml/p0:trainer").describe == "pod ml/p0:trainer"
    assert Slurm("1234").describe == "Slurm job 1234" and Slurm("1234").short == "slurm:1234"
    assert Lxc("/srv/lxc/ct1").short == "lxc:ct1" and Docker("u@c/t").short == "docker:u-c-t"
    assert Proxmox(200).short == "200"  # "h1/200", as before the other kinds
    assert len({p.key for p in RUNTIMES}) == len(RUNTIMES)
    assert Docker("train").key != Podman("train").key


def test_the_config_file_names_each_runtime_by_its_key_and_one_key_an_entry():
    from console.core.targets import resolve

    cfg = {"targets": {"a": {"host": "h1", "docker": "bob@train"}, "b": {"host": "h1", "slurm": "dflash"}}}
    got = resolve(["a", "b"], ConnectOptions.from_target("h1"), config=cfg, path="/cfg.toml")
    assert [t.place for t in got] == [Docker("bob@train"), Slurm("dflash")]
    with pytest.raises(ConfigError, match=r"\[targets.x\] docker: container '-x' is not a name"):
        targets_from_config({"targets": {"x": {"host": "h", "docker": "-x"}}}, "/cfg.toml")
    with pytest.raises(ConfigError, match="pod and lxc each name where the trainer lives; give one"):
        targets_from_config({"targets": {"x": {"host": "h", "pod": "p", "lxc": "c"}}}, "/cfg.toml")
