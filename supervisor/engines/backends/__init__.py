"""Container engines behind one protocol; backends are imported lazily."""

from __future__ import annotations

from stockade.supervisor.engines.backends.base import ContainerBackend


def create_backend(kind: str, base_url: str) -> ContainerBackend:
    """Connect to the engine of that kind at base_url (unix:///path)."""
    if kind == "docker":
        from stockade.supervisor.engines.backends.docker import DockerBackend

        return DockerBackend(base_url)
    if kind == "podman":
        from stockade.supervisor.engines.backends.podman import PodmanBackend

        return PodmanBackend(base_url)
    raise ValueError(f"unknown engine kind {kind!r}")
