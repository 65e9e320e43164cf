"""Pieces both SDK backends share: reading inspect data."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from stockade.supervisor.backends.base import ContainerInfo, ContainerSpec


def parse_time(value: Any) -> datetime | None:
    if isinstance(value, (int, float)):
        return datetime.fromtimestamp(value).astimezone()
    if not isinstance(value, str) or not value:
        return None
    text = value.rstrip("Z")
    head, _, frac = text.partition(".")
    digits = "".join(c for c in frac if c.isdigit())[:6]
    zone = frac[len(digits) :] if digits else ""
    try:
        stamp = datetime.fromisoformat(f"{head}.{digits or '0'}{zone}")
    except ValueError:
        return None
    return stamp if stamp.tzinfo else stamp.astimezone()


def info_from_inspect(attrs: Mapping[str, Any]) -> ContainerInfo:
    """ContainerInfo from an engine's inspect document (Docker and libpod agree here)."""
    state = attrs.get("State") or {}
    config = attrs.get("Config") or {}
    return ContainerInfo(
        id=str(attrs.get("Id", "")),
        name=str(attrs.get("Name", "")).lstrip("/"),
        running=bool(state.get("Running")),
        status=str(state.get("Status", "")),
        labels=dict(config.get("Labels") or {}),
        image=str(attrs.get("ImageName") or config.get("Image") or ""),
        created_at=parse_time(attrs.get("Created")),
        exit_code=state.get("ExitCode"),
        oom_killed=bool(state.get("OOMKilled")),
    )


def label_filters(labels: Mapping[str, str]) -> list[str]:
    return [f"{k}={v}" for k, v in labels.items()]


def ulimits(spec: ContainerSpec) -> dict[str, int]:
    """The container's rlimits (soft = hard), in the engines' names and units (bytes)."""
    limits = {"nofile": spec.nofile, "nproc": spec.nproc}
    if spec.fsize > 0:
        limits["fsize"] = spec.fsize
    return limits
