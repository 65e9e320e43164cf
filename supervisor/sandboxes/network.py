"""Which network a sandbox gets (the configured one, or a narrower one a request asks for),
and its egress link while it runs. A narrower network asked for is the key's from then on
(kept in its folder, `network`): a container re-created after a heal, a prune or a maximum
age gets it again, never the wider configured one."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

from stockade.supervisor.config import NETWORK_MODES, Config
from stockade.supervisor.engines.backends.base import (
    LABEL_KEY,
    LABEL_NETWORK,
    LABEL_NETWORK_ALLOW,
    LABEL_PROFILE,
    ContainerInfo,
)
from stockade.supervisor.errors import InvalidRequest, PolicyDenied, Unsupported
from stockade.supervisor.models import NetworkRequest
from stockade.supervisor.network.allowlist import Allowlist, AllowlistError
from stockade.supervisor.network.egress import EgressHooks, EgressNetwork
from stockade.supervisor.network.proxy import EgressDecision
from stockade.supervisor.sandboxes.brokering import Brokering
from stockade.supervisor.sandboxes.sandbox import Container, SandboxNetwork

log = logging.getLogger("stockade")

KEPT = "network"
"""The file in a key's folder that keeps the network a request chose for it."""
MAX_NETWORK_ALLOW = 256
"""Patterns an EnsureSandbox request may list (they travel in a container label)."""


class Networks:
    def __init__(
        self,
        config: Config,
        instance_id: str,
        record_egress: Callable[[EgressDecision], None] | None = None,
        hooks: EgressHooks | None = None,
    ) -> None:
        self._config = config
        self.egress = EgressNetwork(
            config.network,
            instance_id,
            record_egress or _ignore,
            state_dir=config.state_dir,
            hooks=hooks,
            brokering=bool(config.secrets),
        )
        self.brokering = Brokering(config, lambda: self.egress.authority().certificate_pem)
        """The brokered secrets ([secrets]): their placeholders, trust and Broker."""

    def choose(self, request: NetworkRequest | None) -> SandboxNetwork:
        """The network a sandbox gets: the configured one, or a narrower one asked for."""
        configured = self._config.sandbox.network
        mode = (request.mode if request else "") or configured
        if mode not in NETWORK_MODES:
            raise InvalidRequest(f"network mode must be one of {list(NETWORK_MODES)}, not {mode!r}")
        if NETWORK_MODES.index(mode) > NETWORK_MODES.index(configured):
            raise PolicyDenied(
                f"network mode {mode!r} is wider than the configured {configured!r} "
                "(a request may narrow the network, never widen it)"
            )
        if mode == "egress" and self._config.engine.kind == "kubernetes":
            raise Unsupported(
                "network mode 'egress' builds its link on the supervisor's host, which a pod "
                "is not on: not with engine.kind kubernetes (modes none and open are)"
            )
        if request is not None and len(request.allow) > MAX_NETWORK_ALLOW:
            raise InvalidRequest(
                f"a network allowlist may have at most {MAX_NETWORK_ALLOW} patterns, "
                f"not {len(request.allow)}"
            )
        if request is not None and request.allow and mode != "egress":
            raise InvalidRequest("an allowlist applies only to network mode 'egress'")
        if mode != "egress":
            return SandboxNetwork(mode)
        configured_list = self.egress.allowlist
        try:
            chosen = configured_list.narrowed(request.allow) if request and request.allow else None
        except AllowlistError as exc:
            raise PolicyDenied(f"network allowlist: {exc}") from exc
        return SandboxNetwork(mode, (chosen or configured_list).patterns)

    def remember(self, folder: Path, network: SandboxNetwork) -> None:
        """Keep the network a request chose as the key's (in its folder)."""
        data = {"mode": network.mode, "allow": list(network.allow)}
        (folder / KEPT).write_text(json.dumps(data) + "\n")

    def kept(self, folder: Path) -> SandboxNetwork:
        """The key's network: the one a request chose for it (re-checked against today's
        config), or the configured one. A kept one that today's config no longer allows
        gives mode none, never the wider configured one."""
        try:
            data = json.loads((folder / KEPT).read_text())
        except FileNotFoundError:
            return self.choose(None)
        except (OSError, ValueError) as exc:
            log.warning("the network kept in %s is unreadable (%s): mode none", folder, exc)
            return SandboxNetwork("none")
        try:
            allow = tuple(str(p) for p in data.get("allow") or ())
            return self.choose(NetworkRequest(str(data.get("mode", "none")), allow))
        except (InvalidRequest, PolicyDenied, AttributeError) as exc:
            log.warning("the network kept in %s is no longer allowed (%s): mode none", folder, exc)
            return SandboxNetwork("none")

    def of_container(self, info: ContainerInfo) -> SandboxNetwork | None:
        """An adopted container's network as it was created, re-checked against today's
        config: None when it is now wider than allowed (the container is then replaced)."""
        mode = info.labels.get(LABEL_NETWORK, "none")
        allow = tuple(p for p in info.labels.get(LABEL_NETWORK_ALLOW, "").split(",") if p)
        try:
            return self.choose(NetworkRequest(mode, allow))
        except (InvalidRequest, PolicyDenied) as exc:
            log.warning("replacing sandbox %r: %s", info.labels.get(LABEL_KEY, ""), exc)
            return None

    def environment(self, network: SandboxNetwork) -> dict[str, str]:
        """What a container on this network is told (the egress proxy's address)."""
        return dict(self.egress.environment) if network.mode == "egress" else {}

    async def attach(self, key: str, container: Container, network: SandboxNetwork) -> None:
        """Serve the sandbox's egress proxy, with the Broker of its brokered secrets (those
        of its key's tenant and its container's profile)."""
        if network.mode == "egress":
            allowlist = Allowlist(network.allow, self._config.network.ports)
            profile = container.info.labels.get(LABEL_PROFILE, "")
            broker = self.brokering.broker(key, container.sid, profile)
            await self.egress.attach(
                key, container.sid, container.info.pid, allowlist, broker=broker
            )

    async def detach(self, container: Container) -> None:
        if container.sid:
            await self.egress.detach(container.sid)


def _ignore(_decision: EgressDecision) -> None:
    pass
