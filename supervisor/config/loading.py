"""Loading the configuration once: the TOML file, then STOCKADE_* environment values, then
flags; every table is built into its frozen dataclass, and an unknown key anywhere is an
error at load, never a silent pass."""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from types import UnionType
from typing import Any, Literal, get_args, get_origin, get_type_hints

from stockade.supervisor.config.root import Config
from stockade.supervisor.errors import ConfigError


def _build(cls: type[Any], data: dict[str, Any], where: str) -> Any:
    hints = get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"unknown key(s) in [{where or 'top level'}]: {', '.join(unknown)}")
    kwargs = {
        name: _coerce(hints[name], value, f"{where}.{name}" if where else name)
        for name, value in data.items()
    }
    try:
        return cls(**kwargs)
    except TypeError as exc:  # a required key is missing
        raise ConfigError(f"[{where}]: {exc}") from exc


def _coerce(hint: Any, value: Any, path: str) -> Any:
    origin, args = get_origin(hint), get_args(hint)
    if origin is UnionType and type(None) in args:  # TOML has no null: the value is set
        (hint,) = (a for a in args if a is not type(None))
        origin, args = get_origin(hint), get_args(hint)
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise ConfigError(f"[{path}] must be a table")
        return _build(hint, value, path)  # type: ignore[arg-type]
    if origin is tuple:
        if not isinstance(value, list):
            raise ConfigError(f"{path} must be a list")
        return tuple(_coerce(args[0], item, f"{path}[{i}]") for i, item in enumerate(value))
    if origin in (Mapping, dict):
        if not isinstance(value, dict):
            raise ConfigError(f"[{path}] must be a table")
        return {str(k): _coerce(args[1], v, f"{path}.{k}") for k, v in value.items()}
    if hint is Any:
        return value
    if hint is Path:
        if not isinstance(value, str):
            raise ConfigError(f"{path} must be a string path")
        return Path(value)
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{path} must be one of {list(args)}, got {value!r}")
        return value
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
        raise ConfigError(f"{path} must be {hint.__name__}, got {type(value).__name__}")
    return value


def load_config(path: Path | None = None, overrides: dict[str, Any] | None = None) -> Config:
    """Load the TOML file (if any), then STOCKADE_* environment values, then overrides.

    Environment: STOCKADE_LISTEN, STOCKADE_STATE_DIR, STOCKADE_ENGINE, STOCKADE_ENGINE_SOCKET.
    Overrides are dotted names, e.g. {"engine.kind": "docker"}.
    """
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(path.read_bytes().decode())  # TOML is UTF-8, whatever the locale
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config {path}: {exc}") from exc
        except RecursionError:
            raise ConfigError(f"cannot read config {path}: it nests too deeply") from None
    env = {
        "listen": os.environ.get("STOCKADE_LISTEN"),
        "state_dir": os.environ.get("STOCKADE_STATE_DIR"),
        "engine.kind": os.environ.get("STOCKADE_ENGINE"),
        "engine.socket": os.environ.get("STOCKADE_ENGINE_SOCKET"),
    }
    for dotted, value in [*env.items(), *(overrides or {}).items()]:
        if value is not None:
            _set_dotted(data, dotted, value)
    return _build(Config, data, "")  # type: ignore[no-any-return]


def config_from_toml(text: str, where: str = "the candidate config") -> Config:
    """A config from TOML text alone (no file, no environment): a candidate a caller sends."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"cannot read {where}: {exc}") from exc
    except RecursionError:
        raise ConfigError(f"cannot read {where}: it nests too deeply") from None
    return _build(Config, data, "")  # type: ignore[no-any-return]


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = data
    for name in parents:
        node = node.setdefault(name, {})
    node[leaf] = value
