"""Where the supervisor reaches a sandbox's agent, as the host kind chooses it: a unix socket in
a bind-mounted folder on this host (Podman, Docker), or TCP with mutual TLS (an agent reached
over the network, such as a pod's IP). Each address opens its own gRPC channel; nothing above
the channel tells them apart (sandboxes/agent_link.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import grpc

from stockade.supervisor.errors import SandboxBroken

MAX_SOCKET_PATH = 107


@dataclass(frozen=True)
class UnixAddress:
    """An agent's unix socket on this host (in the sandbox's bind-mounted run folder). The
    folder is sealed so that only the supervisor reaches it: no credentials on the channel."""

    path: Path

    def channel(self, options: list[tuple[str, Any]]) -> grpc.aio.Channel:
        self.check()
        return grpc.aio.insecure_channel(f"unix:{self.path}", options=options)

    def check(self, suffix: int = 0) -> None:
        """SandboxBroken when the path, with `suffix` more bytes (the framed socket's), is
        longer than a unix socket's path may be."""
        if len(str(self.path)) + suffix > MAX_SOCKET_PATH:
            raise SandboxBroken(
                f"agent socket path {self.path} is longer than {MAX_SOCKET_PATH - suffix} "
                "bytes; use a shorter state_dir"
            )

    def present(self) -> bool:
        """Whether there is anything to connect to yet (the agent makes its socket)."""
        return self.path.exists()

    def __str__(self) -> str:
        return str(self.path)


@dataclass(frozen=True, repr=False)
class MutualTls:
    """Both ends prove who they are: the agent's certificate must be issued by `ca` for
    `server_name` (not for the address dialled: a pod's IP changes with every pod), and the
    supervisor presents `cert_chain` with its `private_key`, which the agent checks against the
    same CA. All PEM."""

    ca: bytes
    cert_chain: bytes
    private_key: bytes
    server_name: str

    def __post_init__(self) -> None:
        if not (self.ca and self.cert_chain and self.private_key and self.server_name):
            raise ValueError("mutual TLS needs a CA, a certificate chain, a key and a server name")

    def __repr__(self) -> str:  # never the key
        return f"MutualTls(server_name={self.server_name!r})"


@dataclass(frozen=True)
class TcpAddress:
    """An agent reached over the network, always with mutual TLS (it serves the sandbox's
    commands: a plain TCP port would be a shell for anyone who reaches it)."""

    host: str
    port: int
    tls: MutualTls

    def __post_init__(self) -> None:
        if not self.host or not 0 < self.port < 65536:
            raise ValueError(f"not an agent address: {self.host!r} port {self.port}")

    def channel(self, options: list[tuple[str, Any]]) -> grpc.aio.Channel:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=self.tls.ca,
            private_key=self.tls.private_key,
            certificate_chain=self.tls.cert_chain,
        )
        options = [*options, ("grpc.ssl_target_name_override", self.tls.server_name)]
        return grpc.aio.secure_channel(str(self), credentials, options=options)

    def present(self) -> bool:
        return True  # nothing to wait for before dialling: the channel retries

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


AgentAddress: TypeAlias = UnixAddress | TcpAddress
