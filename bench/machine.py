"""What the figures were measured on: CPU, memory, kernel, engines and library versions."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from bench.engines import cli_env, cli_path


def machine_info(engines: tuple[str, ...]) -> dict[str, Any]:
    info: dict[str, Any] = {
        "cpu": _cpuinfo("model name"),
        "cores": os.cpu_count(),
        "ram_gib": round(_meminfo_kib("MemTotal") / 1024 / 1024, 1),
        "kernel": platform.release(),
        "os": _os_release(),
        "cgroup": "v2" if Path("/sys/fs/cgroup/cgroup.controllers").exists() else "v1",
        "python": platform.python_version(),
        "grpcio": _version("grpcio"),
        "llm-sandbox": _version("llm-sandbox"),
    }
    for engine in engines:
        info[engine] = _engine_versions(engine)
    return info


def _engine_versions(engine: str) -> dict[str, str]:
    if engine == "podman":
        return {
            "version": _cli(engine, "version", "--format", "{{.Client.Version}}"),
            "runtime": _cli(engine, "info", "--format", "{{.Host.OCIRuntime.Name}}"),
            "cgroup_manager": _cli(engine, "info", "--format", "{{.Host.CgroupManager}}"),
        }
    client_version = _cli(engine, "version", "--format", "{{.Client.Version}}")
    return {
        "version": _cli(engine, "version", "--format", "{{.Server.Version}}"),
        "runtime": _cli(engine, "info", "--format", "{{.DefaultRuntime}}"),
        "client": f"{cli_path(engine)} {client_version}",
    }


def _cli(engine: str, *args: str) -> str:
    try:
        proc = subprocess.run(
            [cli_path(engine), *args], capture_output=True, text=True, timeout=30, env=cli_env()
        )
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        return f"? ({exc})"
    lines = proc.stdout.strip().splitlines()
    return lines[0] if proc.returncode == 0 and lines else "?"


def _cpuinfo(field: str) -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith(field):
            return line.split(":", 1)[1].strip()
    return "?"


def _meminfo_kib(field: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    return 0


def _os_release() -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    return "?"


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"
