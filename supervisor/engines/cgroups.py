"""One sample of a container's cgroup, read from the host by its main process's pid: memory in
use, its cache and limit, and the CPU time used so far (cgroup v2 and v1). None when the
cgroup cannot be read (the supervisor in a container of its own, another pid namespace).
Used by the E2B front's metrics and the console's sandbox pages."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class CgroupSample:
    cpu_ns: int
    """CPU time used by the container so far."""
    memory: int
    cache: int
    limit: int
    """0 when unlimited or unknown."""


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _stat(path: Path) -> dict[str, int]:
    found: dict[str, int] = {}
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        name, _, value = line.partition(" ")
        if value.strip().isdigit():
            found[name] = int(value)
    return found


def cgroup_paths(pid: int, root: Path = CGROUP_ROOT) -> dict[str, Path]:
    """The cgroup folders of a process by controller ("" for the unified, v2 hierarchy)."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return {}
    paths: dict[str, Path] = {}
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _hier, controllers, where = parts
        relative = where.lstrip("/")
        if not controllers:
            paths[""] = root / relative
        for controller in controllers.split(","):
            if controller and not controller.startswith("name="):
                paths[controller] = root / controller / relative
    return paths


def sample(pid: int, root: Path = CGROUP_ROOT) -> CgroupSample | None:
    """The container's figures from its main process's cgroup; None when unreadable."""
    if pid <= 0:
        return None
    paths = cgroup_paths(pid, root)
    memory_dir, cpu_dir = paths.get("memory"), paths.get("cpuacct")
    if memory_dir is not None and cpu_dir is not None:  # v1
        usage = _read_int(memory_dir / "memory.usage_in_bytes")
        cpu = _read_int(cpu_dir / "cpuacct.usage")
        if usage is None or cpu is None:
            return None
        limit = _read_int(memory_dir / "memory.limit_in_bytes") or 0
        stat = _stat(memory_dir / "memory.stat")
        cache = stat.get("total_cache", stat.get("cache", 0))
        return CgroupSample(cpu, usage, cache, limit if limit < 1 << 60 else 0)
    unified = paths.get("")
    if unified is None:
        return None
    usage = _read_int(unified / "memory.current")
    cpu_stat = _stat(unified / "cpu.stat")
    if usage is None or "usage_usec" not in cpu_stat:
        return None
    limit = _read_int(unified / "memory.max") or 0  # "max": not an int, unlimited
    cache = _stat(unified / "memory.stat").get("file", 0)
    return CgroupSample(cpu_stat["usage_usec"] * 1000, usage, cache, limit)
