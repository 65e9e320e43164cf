"""Container engines behind one protocol; backends are imported lazily."""

from __future__ import annotations

from typing import TYPE_CHECKING

from stockade.supervisor.engines.backends.base import ContainerBackend

if TYPE_CHECKING:
    from stockade.supervisor.config.sandbox import KubernetesConfig


def create_backend(
    kind: str, base_url: str, kubernetes: KubernetesConfig | None = None
) -> ContainerBackend:
    """Connect to the engine of that kind at base_url (unix:///path); for kind "kubernetes",
    to the API server `kubernetes` names (its kubeconfig, or the in-cluster account)."""
    if kind == "docker":
        from stockade.supervisor.engines.backends.docker import DockerBackend

        return DockerBackend(base_url)
    if kind == "podman":
        from stockade.supervisor.engines.backends.podman import PodmanBackend

        return PodmanBackend(base_url)
    if kind == "kubernetes":
        from stockade.supervisor.config.sandbox import KubernetesConfig
        from stockade.supervisor.engines.backends.kubernetes.backend import KubernetesBackend

        return KubernetesBackend(kubernetes or KubernetesConfig())
    raise ValueError(f"unknown engine kind {kind!r}")
