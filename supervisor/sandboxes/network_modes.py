"""Which network a sandbox gets (the configured one, or a narrower one a request asks for),
and its egress link while it runs (a host sandbox: a link of its own to its own proxy; a pod:
the proxy environment, and the listener all pods' connections reach, pod_egress.py). A
narrower network asked for is the key's from then on (kept in its folder, `network`): a
container re-created after a heal, a prune or a maximum age gets it again, never the wider
configured one."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from stockade.supervisor.config import NETWORK_MODES, Config, SecretConfig
from stockade.supervisor.config.allowlist import Allowlist, AllowlistError
from stockade.supervisor.config.checks import split_host_port
from stockade.supervisor.engines import hosts
from stockade.supervisor.engines.backends.base import (
    LABEL_KEY,
    LABEL_NETWORK,
    LABEL_NETWORK_ALLOW,
    LABEL_PROFILE,
    ContainerInfo,
)
from stockade.supervisor.errors import ConfigError, InvalidRequest, PolicyDenied, Unsupported
from stockade.supervisor.models import NetworkRequest
from stockade.supervisor.network.egress import EgressHooks, EgressNetwork
from stockade.supervisor.network.proxy import EgressDecision, EgressProxy
from stockade.supervisor.network.shared_proxy import SharedEgressListener
from stockade.supervisor.sandboxes.brokering import Brokering, SecretChanges
from stockade.supervisor.sandboxes.pod_egress import ListPods, PodDirectory
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
        self._record = record_egress or _ignore
        self.egress = EgressNetwork(
            config.network,
            instance_id,
            self._record,
            state_dir=config.state_dir,
            hooks=hooks,
            brokering=bool(config.secrets),
        )
        self.brokering = Brokering(config, lambda: self.egress.authority().certificate_pem)
        """The brokered secrets ([secrets]): their placeholders, trust and Broker."""
        self._shared_proxy = hosts.of_engine(config.engine.kind).shared_egress_proxy
        self.listener: SharedEgressListener | None = None
        """engine.kind kubernetes: the egress proxy all pods connect to (serve_pods)."""
        self.directory: PodDirectory | None = None
        self._proxy_address = ""
        """kubernetes.egress_proxy resolved at start (serve_pods)."""

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
        if mode == "egress" and self._shared_proxy and not self._config.kubernetes.egress_proxy:
            raise Unsupported(
                "network mode 'egress' on pods needs kubernetes.egress_proxy (the egress "
                "Service's host:port, which the pod is told): it is not set"
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
        """What a container on this network is told (the egress proxy's address): a pod,
        the egress Service's (kubernetes.egress_proxy)."""
        if network.mode != "egress":
            return {}
        if self._shared_proxy:
            return proxy_environment(self._proxy_address or self._config.kubernetes.egress_proxy)
        return dict(self.egress.environment)

    async def attach(self, key: str, container: Container, network: SandboxNetwork) -> None:
        """A host sandbox's link and proxy, with the Broker of its brokered secrets (those of
        its key's tenant and its container's profile); nothing for a pod (its IP says whose
        its connections to the shared listener are)."""
        if network.mode == "egress" and not self._shared_proxy:
            allowlist = Allowlist(network.allow, self._config.network.ports)
            profile = container.info.labels.get(LABEL_PROFILE, "")
            broker = self.brokering.broker(key, container.sid, profile)
            await self.egress.attach(
                key, container.sid, container.info.pid, allowlist, broker=broker
            )

    def reload_secrets(
        self, secrets: Mapping[str, SecretConfig], running: Iterable[tuple[str, Container]]
    ) -> SecretChanges:
        """A reload's `[secrets]`: new containers get them (brokering.py reload), and each
        running sandbox's proxy its reloaded Broker (brokering.py rebroker)."""
        changes = self.brokering.reload(secrets)
        for key, container in running:
            old = self.egress.broker_of(container.sid) if container.sid else None
            if old is None or not old.secrets:
                continue
            profile = container.info.labels.get(LABEL_PROFILE, "")
            self.egress.rebroker(container.sid, self.brokering.rebroker(old, key, profile))
        return changes

    async def detach(self, container: Container) -> None:
        if container.sid:
            await self.egress.detach(container.sid)

    def serves_pods(self) -> bool:
        """Whether this supervisor serves the pods' egress proxy: engine.kind kubernetes, a
        configured network of which egress may be chosen, and the Service to reach it."""
        return (
            self._shared_proxy
            and NETWORK_MODES.index(self._config.sandbox.network) >= NETWORK_MODES.index("egress")
            and bool(self._config.kubernetes.egress_proxy)
        )

    async def serve_pods(self, list_pods: ListPods, labels: Mapping[str, str]) -> None:
        """Serve the egress proxy on kubernetes.egress_listen for the pods of `labels` (this
        installation's), when serves_pods(); ConfigError when the address cannot be bound."""
        if not self.serves_pods() or self.listener is not None:
            return
        self._proxy_address = await resolved(self._config.kubernetes.egress_proxy)
        net = self._config.network
        self.directory = PodDirectory(list_pods, labels, self.choose, net.ports)
        listener = SharedEgressListener(self.directory.identify, self._pod_proxy, self._refused)
        host, port = split_host_port(self._config.kubernetes.egress_listen, "egress_listen")
        try:
            bound = await listener.start(host, port)
        except OSError as exc:
            raise ConfigError(
                f"cannot serve the egress proxy on kubernetes.egress_listen "
                f"{self._config.kubernetes.egress_listen!r}: {exc}"
            ) from exc
        self.listener = listener
        log.info("egress proxy for pods on %s:%d", host, bound)

    def _pod_proxy(self, key: str, allowlist: Allowlist) -> EgressProxy:
        return self.egress.new_proxy(key, allowlist)

    def _refused(self, key: str, reason: str) -> None:
        self._record(EgressDecision(key, "", "", 0, False, reason))

    async def close(self) -> None:
        """Stop serving egress (host sandboxes' proxies and the pods' listener)."""
        if self.listener is not None:
            await self.listener.close()
            self.listener = None
        await self.egress.close()


async def resolved(address: str) -> str:
    """host:port with the host resolved to its address (the egress Service's ClusterIP), so
    that sandbox pods need no DNS, which the egress NetworkPolicy does not give them (any DNS
    server that forwards names outside is a way out). The name itself when it does not
    resolve here (logged: such pods reach no proxy unless the policy lets them ask DNS)."""
    host, port = split_host_port(address, "kubernetes.egress_proxy")
    try:
        found = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        log.warning(
            "kubernetes.egress_proxy %r does not resolve here (%s): egress pods get the name, "
            "which they can look up only where the NetworkPolicy lets them ask DNS",
            address,
            exc,
        )
        return address
    ip = str(found[0][4][0])
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def proxy_environment(address: str) -> dict[str, str]:
    """HTTP_PROXY, HTTPS_PROXY and NO_PROXY in both spellings (curl reads only the lower-case
    http_proxy), for the proxy at host:port."""
    proxy = f"http://{address}"
    values = {"HTTP_PROXY": proxy, "HTTPS_PROXY": proxy, "NO_PROXY": "localhost,127.0.0.1,::1"}
    return {**values, **{k.lower(): v for k, v in values.items()}}


def _ignore(_decision: EgressDecision) -> None:
    pass
