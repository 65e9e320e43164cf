"""Supervisor configuration: loaded once (file, then environment, then flags), then frozen.

An unknown key anywhere in the file is an error at load time, never a silent pass.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_type_hints

from stockade.supervisor.errors import ConfigError

EngineKind = Literal["podman", "docker"]
MiB = 1024 * 1024


@dataclass(frozen=True)
class EngineConfig:
    kind: EngineKind = "podman"
    """Which container engine runs the sandboxes."""
    socket: str = ""
    """The engine's API address (unix:///path). Empty: Docker's default socket, or for
    Podman a `podman system service` that the supervisor starts itself."""


@dataclass(frozen=True)
class SandboxConfig:
    image: str = ""
    """Sandbox image; empty means the one `stockade image build` makes for the engine."""
    user: str = "1000:1000"
    """uid:gid the agent and every tool run as. Never root."""
    read_only_root: bool = True
    drop_all_capabilities: bool = True
    no_new_privileges: bool = True
    network: Literal["none"] = "none"
    """Only `none` is built so far."""
    memory_mb: int = 512
    """Memory limit; swap is set to the same value, so no swap."""
    cpus: float = 1.0
    pids: int = 256
    nofile: int = 1024
    nproc: int = 16384
    """RLIMIT_NPROC. The kernel counts it per uid across the host (all sandboxes share uid
    1000), so `pids` is the per-sandbox cap; this must stay at or below the engine process's
    own hard limit, or the container fails to start."""
    tmp_size_mb: int = 64
    """Size cap of the tmpfs at /tmp."""
    start_timeout_s: float = 30.0
    """How long a new container's agent may take to answer."""


@dataclass(frozen=True)
class ToolsConfig:
    exec_default_timeout_s: int = 30
    exec_max_timeout_s: int = 300
    max_output_bytes: int = 10 * MiB
    """Per stream cap on what exec keeps of stdout and of stderr."""
    llm_max_bytes: int = 64 * 1024
    """Cap of ToolResult.for_llm (head and tail kept)."""
    user_max_bytes: int = 1 * MiB
    """Cap of ToolResult.for_user."""


@dataclass(frozen=True)
class Config:
    listen: str = "127.0.0.1:50051"
    """host:port, or unix:/path."""
    state_dir: Path = Path("/var/lib/stockade")
    """Workspaces, agent sockets and the instance id live here."""
    max_request_bytes: int = 16 * MiB
    """Largest request a client may send; larger ones get RESOURCE_EXHAUSTED."""
    max_response_bytes: int = 128 * MiB
    engine: EngineConfig = field(default_factory=EngineConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    tools: ToolsConfig = field(default_factory=ToolsConfig)

    def __post_init__(self) -> None:
        _check(self)


def _check(cfg: Config) -> None:
    positive = {
        "sandbox.memory_mb": cfg.sandbox.memory_mb,
        "sandbox.cpus": cfg.sandbox.cpus,
        "sandbox.pids": cfg.sandbox.pids,
        "sandbox.nofile": cfg.sandbox.nofile,
        "sandbox.nproc": cfg.sandbox.nproc,
        "sandbox.tmp_size_mb": cfg.sandbox.tmp_size_mb,
        "tools.exec_default_timeout_s": cfg.tools.exec_default_timeout_s,
        "tools.max_output_bytes": cfg.tools.max_output_bytes,
        "tools.llm_max_bytes": cfg.tools.llm_max_bytes,
        "max_request_bytes": cfg.max_request_bytes,
    }
    for name, value in positive.items():
        if value <= 0:
            raise ConfigError(f"{name} must be positive, got {value}")
    if cfg.tools.exec_default_timeout_s > cfg.tools.exec_max_timeout_s:
        raise ConfigError("tools.exec_default_timeout_s exceeds tools.exec_max_timeout_s")
    uid = cfg.sandbox.user.split(":", 1)[0]
    if uid in ("0", "root", ""):
        raise ConfigError("sandbox.user must not be root")
    if cfg.engine.kind not in ("podman", "docker"):
        raise ConfigError(f"engine.kind must be podman or docker, got {cfg.engine.kind!r}")


def _build(cls: type[Any], data: dict[str, Any], where: str) -> Any:
    hints = get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"unknown key(s) in [{where or 'top level'}]: {', '.join(unknown)}")
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        hint = hints[name]
        path = f"{where}.{name}" if where else name
        if dataclasses.is_dataclass(hint):
            if not isinstance(value, dict):
                raise ConfigError(f"[{path}] must be a table")
            kwargs[name] = _build(hint, value, path)  # type: ignore[arg-type]
        else:
            kwargs[name] = _coerce(hint, value, path)
    return cls(**kwargs)


def _coerce(hint: Any, value: Any, path: str) -> Any:
    if hint is Path:
        if not isinstance(value, str):
            raise ConfigError(f"{path} must be a string path")
        return Path(value)
    if getattr(hint, "__origin__", None) is Literal:
        if value not in hint.__args__:
            raise ConfigError(f"{path} must be one of {list(hint.__args__)}, got {value!r}")
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
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config {path}: {exc}") from exc
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


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = data
    for name in parents:
        node = node.setdefault(name, {})
    node[leaf] = value
