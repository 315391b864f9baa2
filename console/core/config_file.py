"""The console's config file: ``$XDG_CONFIG_HOME/dflash-console/config.toml`` (default
``~/.config/dflash-console/config.toml``). TOML; each part of the console owns a section and reads
only its own (``[health]`` here; ``[targets]`` in console/core/targets.py). A missing file is an empty
config; a file that is not valid TOML, an unknown key or a value of the wrong type is a
:class:`ConfigError` that names the file and the key, never a silent default.
"""

from __future__ import annotations

import dataclasses
import os
import stat
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from console.core.health import HealthConfig
from console.core.sanitize import clean_text


class ConfigError(ValueError):
    """The config file cannot be used as it is (the message names the file and what is wrong)."""


def config_path(env: dict[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    base = env.get("XDG_CONFIG_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".config")
    return Path(base) / "dflash-console" / "config.toml"


MAX_BYTES = 1 << 20  # a config file is a few hundred bytes; more is not one
MAX_DEPTH = 16  # tables and arrays inside each other ([targets.NAME] is 2)


def _depth_ok(obj: object, left: int = MAX_DEPTH) -> bool:
    if not isinstance(obj, (dict, list)):
        return True
    if left <= 0:
        return False
    values = obj.values() if isinstance(obj, dict) else obj
    return all(_depth_ok(v, left - 1) for v in values)


def _read(p: Path) -> bytes:
    """At most MAX_BYTES + 1 bytes of a regular file (a FIFO or a device is refused, not waited on)."""
    fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError(f"{p}: not a regular file")
        return f.read(MAX_BYTES + 1)


def load(path: Path | str | None = None) -> dict:
    """The whole file as a dict ({} when it does not exist). Bounded: at most MAX_BYTES, nested at most
    MAX_DEPTH levels; anything wrong is one :class:`ConfigError` naming the file, never a traceback."""
    p = Path(path) if path is not None else config_path()
    try:
        data = _read(p)
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise ConfigError(f"{p}: {e.strerror or e}") from e
    if len(data) > MAX_BYTES:
        raise ConfigError(f"{p}: longer than {MAX_BYTES:,} bytes: not a config file")
    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(f"{p}: not UTF-8 (at byte {e.start})") from None
    except RecursionError:
        raise ConfigError(f"{p}: nested deeper than {MAX_DEPTH} levels") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{p}: not valid TOML: {clean_text(str(e))}") from e
    if not _depth_ok(doc):
        raise ConfigError(f"{p}: nested deeper than {MAX_DEPTH} levels")
    return doc


def section(data: dict, name: str, path: Path | str | None = None) -> dict:
    """One ``[name]`` table of a loaded file ({} when absent)."""
    sec = data.get(name, {})
    if not isinstance(sec, dict):
        raise ConfigError(f"{path or config_path()}: [{name}] must be a table")
    return sec


def health_config(data: dict | None = None, path: Path | str | None = None) -> HealthConfig:
    """The ``[health]`` section as a :class:`HealthConfig` (defaults for what it does not set)."""
    where = path or config_path()
    data = load(path) if data is None else data
    sec = section(data, "health", where)
    fields = {f.name: f for f in dataclasses.fields(HealthConfig)}
    values = {}
    for key, value in sec.items():
        f = fields.get(key)
        if f is None:
            raise ConfigError(
                f"{where}: [health] has no setting {key!r} (known: {', '.join(sorted(fields))})"
            )
        default = getattr(HealthConfig, key)
        if isinstance(default, bool):
            if not isinstance(value, bool):
                raise ConfigError(f"{where}: [health] {key} must be true or false, not {value!r}")
        elif isinstance(default, (int, float)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ConfigError(f"{where}: [health] {key} must be a number >= 0, not {value!r}")
            value = float(value)
        values[key] = value
    return HealthConfig(**values)
