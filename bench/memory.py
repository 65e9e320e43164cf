"""Host memory of a container: its own processes (found by cgroup) plus the engine's helper
for it (conmon for Podman, containerd-shim for Docker, found by its command line).

PSS from /proc/PID/smaps_rollup is the figure: pages shared between processes (the agents'
Python, the helpers' binaries) are split among them, so the sum over sandboxes is what the
host really spends. It therefore depends on how many other processes map the same files
(other sandboxes of the same image, other helpers). USS (private pages only: what one more
sandbox costs once the shared pages are paid for) and RSS (every mapped page counted in
full) are kept beside it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KINDS = ("pss", "uss", "rss")
HELPERS = ("conmon", "containerd-shim")
"""comm prefixes of the engines' per-container helpers (comm is cut to 15 characters)."""


@dataclass(frozen=True)
class Proc:
    pid: int
    comm: str
    cgroup: str
    cmdline: str

    @property
    def is_helper(self) -> bool:
        return self.comm.startswith(HELPERS)


def processes() -> list[Proc]:
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            found.append(
                Proc(
                    pid=int(entry.name),
                    comm=_read(entry.path, "comm").strip(),
                    cgroup=_read(entry.path, "cgroup"),
                    cmdline=_read(entry.path, "cmdline").replace("\0", " "),
                )
            )
        except OSError:  # gone meanwhile
            continue
    return found


def _read(proc_dir: str, name: str) -> str:
    return Path(proc_dir, name).read_text(errors="replace")


def memory_kib(pid: int) -> dict[str, int]:
    """PSS, USS (private pages: what removing the process frees) and RSS, in KiB.
    Where smaps_rollup is missing, PSS and USS fall back to RSS."""
    figures = {"rss": _fields(f"/proc/{pid}/status", "VmRSS")["VmRSS"]}
    try:
        rollup = _fields(f"/proc/{pid}/smaps_rollup", "Pss", "Private_Clean", "Private_Dirty")
    except OSError:
        return {**figures, "pss": figures["rss"], "uss": figures["rss"]}
    figures["pss"] = rollup["Pss"]
    figures["uss"] = rollup["Private_Clean"] + rollup["Private_Dirty"]
    return figures


def _fields(path: str, *names: str) -> dict[str, int]:
    """The kB values of the named `Name:  N kB` lines of a /proc file."""
    found = dict.fromkeys(names, 0)
    for line in Path(path).read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in found:
            found[name] = int(rest.split()[0])
    return found


def container_memory(container_id: str, procs: list[Proc]) -> dict[str, Any]:
    """Memory (KiB) of the container's processes and of its helper, with the processes."""
    inside = [p for p in procs if container_id in p.cgroup and not p.is_helper]
    helper = [p for p in procs if p.is_helper and container_id in p.cmdline]
    if not inside:
        raise RuntimeError(f"no process found in the cgroup of container {container_id[:12]}")
    if not helper:
        raise RuntimeError(f"no conmon/containerd-shim found for container {container_id[:12]}")
    return {"inside": _group(inside), "helper": _group(helper)}


def _group(procs: list[Proc]) -> dict[str, Any]:
    figures = [memory_kib(p.pid) for p in procs]
    totals = {f"{kind}_kib": sum(f[kind] for f in figures) for kind in KINDS}
    listed = [{"pid": p.pid, "comm": p.comm, **f} for p, f in zip(procs, figures, strict=True)]
    return {**totals, "processes": listed}


def average(per_sandbox: list[dict[str, Any]]) -> dict[str, Any]:
    """Average MiB per sandbox: total, inside (agent + init) and helper, for each KINDS."""

    def mean_mib(part: str, kind: str) -> float:
        total: int = sum(s[part][f"{kind}_kib"] for s in per_sandbox)
        return round(total / len(per_sandbox) / 1024, 2)

    figures: dict[str, Any] = {"sandboxes": len(per_sandbox)}
    for kind in KINDS:
        inside, helper = mean_mib("inside", kind), mean_mib("helper", kind)
        figures[f"{kind}_mib"] = round(inside + helper, 2)
        figures[f"{kind}_inside_mib"] = inside
        figures[f"{kind}_helper_mib"] = helper
    figures["per_sandbox"] = per_sandbox
    return figures
