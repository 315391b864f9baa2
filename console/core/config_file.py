"""The console's config file: ``$XDG_CONFIG_HOME/dflash-console/config.toml`` (default
``~/.config/dflash-console/config.toml``). TOML; each part of the console owns a section and reads
only its own (``[health]`` here; ``[targets]`` in console/core/targets.py). A missing file is an empty
config; a file that is not valid TOML, an unknown key or a value of the wrong type is a
:class:`ConfigError` that names the file and the key, never a silent default.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from console.core.health import HealthConfig


class ConfigError(ValueError):
    """The config file cannot be used as it is (the message names the file and what is wrong)."""


def config_path(env: dict[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    base = env.get("XDG_CONFIG_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".config")
    return Path(base) / "dflash-console" / "config.toml"


def load(path: Path | str | None = None) -> dict:
    """The whole file as a dict ({} when it does not exist)."""
    p = Path(path) if path is not None else config_path()
    try:
        with open(p, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        return {}
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{p}: not valid TOML: {e}") from e
    except OSError as e:
        raise ConfigError(f"{p}: {e.strerror or e}") from e


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
