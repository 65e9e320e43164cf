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
from pathlib import Path
from typing import Any

from stockade.supervisor.config import Config
from stockade.supervisor.engines.cgroups import CGROUP_ROOT, sample
from stockade.supervisor.fronts.e2b.records import rfc3339


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
