"""GET /sandboxes/{id}/metrics: one sample taken now from the container's cgroup (memory
in use, its cache and limit; CPU use since the previous sample, or since the container
started for the first), and the workspace's disk use when it is a capped volume. E2B keeps
a history; this answers only the present moment. When the cgroup cannot be read (the
supervisor in a container of its own, another pid namespace), the CPU and memory figures
are 0 and the memory total the configured limit."""

from __future__ import annotations

import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stockade.supervisor.config import Config
from stockade.supervisor.fronts.e2b.records import rfc3339

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


class Metrics:
    """Samples of sandboxes, remembering each one's previous CPU figure."""

    def __init__(self, config: Config, root: Path = CGROUP_ROOT) -> None:
        self._config = config
        self._root = root
        self._previous: dict[str, tuple[float, int]] = {}

    def forget(self, sandbox_id: str) -> None:
        self._previous.pop(sandbox_id, None)

    def now(self, sandbox_id: str, pid: int, born: float, workspace: Path) -> dict[str, Any]:
        """One SandboxMetric (every key the SDKs require)."""
        config = self._config.sandbox
        cpus = max(1, math.ceil(config.cpus))
        moment = time.time()
        found = sample(pid, self._root)
        cpu_pct = 0.0
        memory = cache = 0
        total = config.memory_mb << 20
        if found is not None:
            memory, cache = found.memory, found.cache
            total = found.limit or total
            since, used = self._previous.get(sandbox_id, (born, 0))
            elapsed = moment - since
            if elapsed > 0:
                share = (found.cpu_ns - used) / 1e9 / elapsed / cpus * 100.0
                cpu_pct = round(min(max(share, 0.0), 100.0), 2)
            self._previous[sandbox_id] = (moment, found.cpu_ns)
        disk_used = disk_total = 0
        if self._config.sandbox.workspace_size_mb:
            try:
                usage = shutil.disk_usage(workspace)
                disk_used, disk_total = usage.used, usage.total
            except OSError:
                pass
        return {
            "timestamp": rfc3339(moment),
            "timestampUnix": int(moment),
            "cpuCount": cpus,
            "cpuUsedPct": cpu_pct,
            "memUsed": memory,
            "memTotal": total,
            "memCache": cache,
            "diskUsed": disk_used,
            "diskTotal": disk_total,
        }
