"""Targets from the command line and the config file's [targets] section (console/core/targets.py)."""

from __future__ import annotations

import pytest

from console.core.config_file import ConfigError
from console.core.options import ConnectOptions
from console.core.place import HOST, Proxmox
from console.core.targets import resolve, resolve_one, targets_from_config

BASE = ConnectOptions(host="-", port=2222, known_hosts="/kh", identity_files=["/k"], config_files=[])


def test_host_with_several_containers_is_one_target_each_sharing_the_flags():
    ts = resolve(["root@h1"], BASE, places=[Proxmox(200), Proxmox(201)], run_dir="run")
    assert [(t.options.host, t.options.user, t.options.port, t.place, t.run_dir) for t in ts] == [
        ("h1", "root", 2222, Proxmox(200), "run"),
        ("h1", "root", 2222, Proxmox(201), "run"),
    ]
    assert ts[0].options == ts[1].options  # the same connection options: one shared link
    assert [t.where for t in ts] == ["h1 · CT 200", "h1 · CT 201"]


def test_config_names_with_their_own_settings_and_readonly():
    cfg = {
        "targets": {
            "main": {"host": "gpu1", "container": 200, "user": "root", "run_dir": "/r", "label": "long run"},
            "ablation": {"host": "gpu2", "port": 22, "key": "~/.ssh/k", "jump": "bast", "readonly": True},
        }
    }
    main, abl, plain = resolve(["main", "ablation", "other"], BASE, config=cfg)
    assert (main.options.host, main.options.user, main.place, main.run_dir, main.title) == (
        "gpu1",
        "root",
        Proxmox(200),
        "/r",
        "long run",
    )
    assert main.options.port == 2222 and main.options.known_hosts == "/kh"  # the flags fill in the rest
    assert not main.readonly and abl.readonly
    assert (abl.options.port, abl.options.identity_files, abl.options.jump) == (22, ["~/.ssh/k"], "bast")
    assert plain.options.host == "other" and plain.place == HOST
    everything_ro = resolve(["main"], BASE, readonly=True, config=cfg)
    assert everything_ro[0].readonly


@pytest.mark.parametrize(
    "entry, says",
    [
        ({"host": "h", "contaner": 1}, "no setting 'contaner'"),
        ({"host": "h", "container": "200"}, "container must be a int"),
        ({"host": "h", "readonly": 1}, "readonly must be a bool"),
        ({"port": 22}, "needs a host"),
        ({"host": "h", "serve_thinking": "on"}, "serve_thinking needs serve"),
        ({"host": "h", "serve": "vllm:8000", "serve_thinking": "yes"}, "serve_thinking 'yes': on or off"),
    ],
)
def test_bad_entries_name_the_file_and_the_key(entry, says):
    with pytest.raises(ConfigError, match=says) as e:
        targets_from_config({"targets": {"x": entry}}, "/cfg.toml")
    assert "/cfg.toml: [targets.x]" in str(e.value)


def test_serve_thinking_is_the_serving_endpoints_thinking_setting():
    cfg = {"targets": {"t": {"host": "h", "serve": "sglang:30000", "serve_thinking": "off"}}}
    (t,) = resolve(["t"], BASE, config=cfg)
    assert (t.serve.kind, t.serve.port, t.serve.thinking, str(t.serve)) == (
        "sglang",
        30000,
        "off",
        "sglang:30000",
    )


def test_the_same_run_twice_is_an_error():
    with pytest.raises(ConfigError, match="given twice"):
        resolve(["h", "h"], BASE, places=[Proxmox(200)])


def test_one_run_for_the_single_run_commands():
    cfg = {"targets": {"main": {"host": "gpu1", "container": 200, "run_dir": "/r"}, "bare": {"host": "gpu2"}}}
    t, named = resolve_one("main", BASE, config=cfg)
    assert named and (t.options.host, t.place, t.run_dir) == ("gpu1", Proxmox(200), "/r")
    t, named = resolve_one("main", BASE, run_dir="/r", config=cfg)  # the same run dir: fine
    assert t.run_dir == "/r"
    t, named = resolve_one("bare", BASE, run_dir="/x", config=cfg)  # fills in what the entry lacks
    assert named and t.run_dir == "/x" and t.place == HOST
    t, named = resolve_one("h1", BASE, places=[Proxmox(201)], run_dir="/y", config=cfg)
    assert not named and (t.options.host, t.place, t.run_dir) == ("h1", Proxmox(201), "/y")
    with pytest.raises(ConfigError, match="differs"):
        resolve_one("main", BASE, run_dir="/other", config=cfg)
    with pytest.raises(ConfigError, match="--ct goes with a HOST"):
        resolve_one("main", BASE, places=[Proxmox(201)], config=cfg)
    with pytest.raises(ConfigError, match="names 2 runs"):
        resolve_one("h1", BASE, places=[Proxmox(200), Proxmox(201)], config=cfg)


def test_ct_with_config_names_only_is_the_one_run_commands_error():
    """``status main --ct 201`` used to ignore --ct; it is resolve_one's error now, word for word. A
    --ct with a HOST among the names still goes to that host."""
    cfg = {"targets": {"main": {"host": "gpu1", "container": 200}}}
    with pytest.raises(ConfigError) as many:
        resolve(["main"], BASE, places=[Proxmox(201)], config=cfg, path="/cfg.toml")
    with pytest.raises(ConfigError) as one:
        resolve_one("main", BASE, places=[Proxmox(201)], config=cfg, path="/cfg.toml")
    assert str(many.value) == str(one.value) and "--ct goes with a HOST" in str(many.value)
    main, host = resolve(["main", "h2"], BASE, places=[Proxmox(201)], config=cfg)
    assert (main.place, host.place) == (Proxmox(200), Proxmox(201))
