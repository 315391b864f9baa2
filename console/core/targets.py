"""Targets: which runs the console follows. ``connect HOST --ct 200 --ct 201`` gives one per container
of a host; the config file's ``[targets]`` section names them::

    [targets.main]
    host = "10.1.2.6"        # [user@]host or a Host alias of ~/.ssh/config (required)
    container = 200          # Proxmox container (console/core/place.py); absent: the host itself
    user = "root"
    port = 22
    key = "~/.ssh/id_ed25519"
    jump = "bastion"         # -J [user@]host[:port][,...]
    known_hosts = "~/.ssh/known_hosts"
    run_dir = "/root/runs/a" # the trainer's --output-dir
    label = "main run"       # shown in the overview (default: the name)
    readonly = true          # hide every changing action for this run
    pyspy = "/opt/py-spy/bin/py-spy"  # py-spy in the container for the threads view (else the helper's PATH)

``resolve(names, ...)`` turns the command line's positionals into targets: a name of the config is
that target, anything else is a host (with each ``--ct`` given, or the host itself). Where in the host
the trainer lives (``container``, ``--ct``) is a :class:`~console.core.place.Place`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from console.core.config_file import ConfigError, config_path, section
from console.core.options import ConnectOptions
from console.core.place import CONFIG_KEYS, HOST, Place, PlaceError, from_config, parse
from console.core.sanitize import clean_text
from console.core.serving import Endpoint, EndpointError, parse_endpoint, with_thinking

KEYS = {
    "host": str,
    "user": str,
    "port": int,
    "key": str,
    "jump": str,
    "known_hosts": str,
    "run_dir": str,
    "label": str,
    "readonly": bool,
    "serve": str,
    "serve_thinking": str,
    "pyspy": str,
}


@dataclass(frozen=True)
class Target:
    name: str
    options: ConnectOptions
    place: Place = HOST
    run_dir: str | None = None
    label: str = ""
    readonly: bool = False
    serve: Endpoint | None = None  # a serving endpoint whose acceptance the screen shows (serving.py)
    pyspy: str | None = None  # the operator's py-spy in the container (console/core/pyspy.py)

    @property
    def where(self) -> str:
        """host · CT N (what the overview and the dialogs name)."""
        return self.place.at(self.options.host)

    @property
    def title(self) -> str:
        return self.label or self.name


def targets_from_config(data: dict, path: Path | str | None = None) -> dict[str, dict]:
    """The ``[targets]`` section, each entry checked (unknown keys and wrong types are errors)."""
    where = path or config_path()
    sec = section(data, "targets", where)
    out = {}
    for name, entry in sec.items():
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: [targets.{name}] must be a table")
        for key, value in entry.items():
            if key in CONFIG_KEYS:  # where the trainer lives: checked by its one parser
                try:
                    parse(key, value)
                except PlaceError as e:
                    raise ConfigError(f"{where}: [targets.{name}] {e}") from None
                continue
            kind = KEYS.get(key)
            if kind is None:
                known = ", ".join(sorted({*KEYS, *CONFIG_KEYS}))
                raise ConfigError(f"{where}: [targets.{name}] has no setting {key!r} (known: {known})")
            ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
            if not ok:
                raise ConfigError(f"{where}: [targets.{name}] {key} must be a {kind.__name__}, not {value!r}")
        try:
            from_config(entry)
            _endpoint(entry)
        except (PlaceError, EndpointError) as e:
            raise ConfigError(f"{where}: [targets.{name}] {e}") from None
        if "host" not in entry:
            raise ConfigError(f"{where}: [targets.{name}] needs a host")
        out[name] = entry
    return out


def _endpoint(entry: dict) -> Endpoint | None:
    """``serve`` with ``serve_thinking`` (serving.py); ``EndpointError``."""
    return with_thinking(
        parse_endpoint(entry["serve"]) if "serve" in entry else None, entry.get("serve_thinking")
    )


def _from_entry(name: str, entry: dict, base: ConnectOptions) -> Target:
    opts = ConnectOptions.from_target(
        entry["host"],
        port=entry.get("port", base.port),
        user=entry.get("user", base.user),
        identity_files=[entry["key"]] if "key" in entry else list(base.identity_files),
        config_files=base.config_files,
        known_hosts=entry.get("known_hosts", base.known_hosts),
        jump=entry.get("jump", base.jump),
    )
    return Target(
        name=clean_text(name),  # a name and a label are shown as they are: cleaned (sanitize.py)
        options=opts,
        place=from_config(entry),
        run_dir=entry.get("run_dir"),
        label=clean_text(entry.get("label", name)),
        readonly=entry.get("readonly", False),
        serve=_endpoint(entry),
        pyspy=entry.get("pyspy"),
    )


def ct_with_name(name: str, places: list[Place], path: Path | str | None = None) -> str:
    """The one message for a place's flag (``--ct``, ``--docker``) given with a config name (its entry names
    where the trainer lives)."""
    flags = " / ".join(sorted({str(type(p).FLAG) for p in places}))
    return (
        f"{name} is a target of {path or config_path()} (its entry names where the trainer lives); "
        f"{flags} goes with a HOST, not a target name"
    )


def resolve(
    names: list[str],
    base: ConnectOptions,
    places: list[Place] | None = None,
    run_dir: str | None = None,
    readonly: bool = False,
    config: dict | None = None,
    path: Path | str | None = None,
) -> list[Target]:
    """Targets for the positionals ``names``: a config name is that target (the command line's
    connection flags fill in what it does not set; ``--readonly`` makes it read-only); any other
    name is ``[user@]host``, one target per place of ``places`` (the ``--ct`` flags; none: the host
    itself), with ``--run-dir``. ``places`` with config names only is a :class:`ConfigError`
    (:func:`ct_with_name`)."""
    named = targets_from_config(config or {}, path)
    if places and all(name in named for name in names):  # no HOST for the --ct to go with
        raise ConfigError(ct_with_name(names[0], places, path))
    out: list[Target] = []
    for name in names:
        if name in named:
            t = _from_entry(name, named[name], base)
            out.append(replace(t, readonly=t.readonly or readonly))
            continue
        opts = replace(
            ConnectOptions.from_target(name), port=base.port, identity_files=list(base.identity_files)
        )
        opts = replace(
            opts,
            user=opts.user or base.user,
            config_files=base.config_files,
            known_hosts=base.known_hosts,
            jump=base.jump,
        )
        for place in places or [HOST]:
            label = f"{name}/{place.short}" if place.short else name
            out.append(Target(label, opts, place, run_dir, label, readonly))
    seen: set[tuple] = set()
    for t in out:
        key = (t.options.display, t.place.key, t.run_dir)
        if key in seen:
            raise ConfigError(f"{t.where} ({t.run_dir or 'any run dir'}) is given twice")
        seen.add(key)
    return out


def resolve_one(
    name: str,
    base: ConnectOptions,
    places: list[Place] | None = None,
    run_dir: str | None = None,
    config: dict | None = None,
    path: Path | str | None = None,
) -> tuple[Target, bool]:
    """The one run of ``stop``/``restart``/``launch``/``deploy``/``logs``: ``name``
    through :func:`resolve`, and whether it is a config name. A config name takes no ``places`` (the
    entry names its container); ``--run-dir`` fills in an entry without ``run_dir`` and must match
    one that has it. Anything that names more than one run is a :class:`ConfigError`."""
    named = targets_from_config(config or {}, path)
    is_name = name in named
    if is_name and places:
        raise ConfigError(ct_with_name(name, places, path))
    found = resolve([name], base, places=places or None, run_dir=run_dir, config=config, path=path)
    if len(found) != 1:  # several places of a HOST
        runs = ", ".join(t.where for t in found)
        given = " ".join(f for p in places or [] for f in p.flags())
        one = " / ".join(sorted({str(type(p).FLAG) for p in places or []}))
        raise ConfigError(
            f"{name} with {given} names {len(found)} runs ({runs}); this command acts on one: give one {one}"
        )
    t = found[0]
    if is_name and run_dir is not None:
        if t.run_dir is None:
            t = replace(t, run_dir=run_dir)
        elif t.run_dir != run_dir:
            raise ConfigError(
                f"{name} of {path or config_path()} has run_dir {t.run_dir!r}; --run-dir {run_dir!r} differs"
            )
    return t, is_name


def names(config: dict | None = None, path: Path | str | None = None) -> list[str]:
    """The config's target names (for messages)."""
    return sorted(targets_from_config(config or {}, path))
