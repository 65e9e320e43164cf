"""Host pressure: a new container is refused while the host is short of memory or disk,
with a clear reason, instead of letting the engine fail half-way (or the OOM killer pick)."""

from __future__ import annotations

from pathlib import Path

import psutil

from stockade.supervisor.config import HousekeepingConfig
from stockade.supervisor.errors import HostExhausted

MiB = 1024 * 1024


def check(config: HousekeepingConfig, state_dir: Path) -> None:
    """Raise HostExhausted when available memory or free disk under state_dir is below the
    configured minimum."""
    if config.min_free_memory_mb:
        available = psutil.virtual_memory().available
        if available < config.min_free_memory_mb * MiB:
            raise HostExhausted(
                f"no new sandbox: the host has {available // MiB} MiB of memory available, "
                f"below housekeeping.min_free_memory_mb = {config.min_free_memory_mb}; "
                "running sandboxes keep working"
            )
    if config.min_free_disk_mb:
        free = psutil.disk_usage(str(state_dir)).free
        if free < config.min_free_disk_mb * MiB:
            raise HostExhausted(
                f"no new sandbox: {state_dir} has {free // MiB} MiB of disk free, below "
                f"housekeeping.min_free_disk_mb = {config.min_free_disk_mb}; running "
                "sandboxes keep working"
            )
