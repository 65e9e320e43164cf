"""Egress for the sandbox manager: per sandbox, the link (links.py) and its proxy (proxy.py).
The manager calls attach() once the container runs (again after adoption: the link is
rebuilt, since the proxy's listening socket died with the previous supervisor) and detach()
when the container goes."""

from __future__ import annotations

import asyncio
import os
import ssl
from dataclasses import dataclass, field
from pathlib import Path

from stockade.supervisor.config import NetworkConfig
from stockade.supervisor.config.allowlist import Allowlist, canonical_host
from stockade.supervisor.errors import ConfigError, SandboxBroken
from stockade.supervisor.keys import shown
from stockade.supervisor.network import links
from stockade.supervisor.network.brokered import Broker, InjectionRecorder, no_record
from stockade.supervisor.network.mint import Authority, AuthorityError
from stockade.supervisor.network.proxy import EgressProxy, ProxySettings, Recorder
from stockade.supervisor.observe.alarms import Alarm, AlarmSink, NoTripwire, Tripwire

NODE_PRELOAD = "/usr/local/lib/stockade/proxy.js"
"""In the sandbox image: points Node's fetch at HTTPS_PROXY (sandbox_image/node/proxy.js)."""
CA_FOLDER = "egress-ca"
"""The installation's egress CA, in the state directory (mint.Authority)."""


def _no_alarm(_alarm: Alarm) -> None:
    pass


@dataclass(frozen=True)
class EgressHooks:
    """Where the proxies report: alarms (a placeholder on its way to the wrong place), the
    honeytokens' tripwire, and each injection of a brokered secret (the audit log)."""

    alarm: AlarmSink = _no_alarm
    tripwire: Tripwire = field(default_factory=NoTripwire)
    record_injection: InjectionRecorder = no_record


class EgressNetwork:
    def __init__(
        self,
        config: NetworkConfig,
        instance_id: str,
        record: Recorder,
        *,
        state_dir: Path | None = None,
        hooks: EgressHooks | None = None,
        brokering: bool = False,
    ) -> None:
        """state_dir: where the egress CA is kept (needed with brokered secrets);
        brokering: whether any are configured (then the CA and the upstream trust are
        loaded at once, so a bad one fails the start)."""
        self._config = config
        self._prefix = links.instance_prefix(instance_id)
        self._record = record
        self._state_dir = state_dir
        self._hooks = hooks or EgressHooks()
        self._authority: Authority | None = None
        self._upstream: ssl.SSLContext | None = None
        if brokering:
            self.authority()
            self.upstream()
        self.allowlist = Allowlist(config.allow, config.ports)
        self._settings = ProxySettings(
            ports=frozenset(config.ports),
            hosts={canonical_host(k): v for k, v in config.hosts.items()},
            allow_private_addresses=config.allow_private_addresses,
            max_connections=config.max_connections,
            connect_timeout_s=config.connect_timeout_s,
            idle_timeout_s=config.idle_timeout_s,
        )
        self._proxies: dict[str, EgressProxy] = {}
        plan = self._plan("")
        proxy = f"http://{plan.proxy_address}:{plan.proxy_port}"
        values = {"HTTP_PROXY": proxy, "HTTPS_PROXY": proxy, "NO_PROXY": "localhost,127.0.0.1,::1"}
        self.environment = {
            **values,
            **{k.lower(): v for k, v in values.items()},
            "NODE_OPTIONS": f"--require {NODE_PRELOAD}",
        }
        """What programs in the sandbox read to find the proxy (both spellings: curl reads
        only the lower-case http_proxy; Node's fetch reads none: the preload points it)."""

    def authority(self) -> Authority:
        """The installation's egress CA (made on first use), which signs the certificates
        the proxy shows for the hosts it intercepts."""
        if self._authority is None:
            if self._state_dir is None:
                raise ConfigError("brokered secrets need a state directory for the egress CA")
            try:
                self._authority = Authority.load_or_create(self._state_dir / CA_FOLDER)
            except AuthorityError as exc:
                raise ConfigError(f"egress CA: {exc}") from exc
        return self._authority

    def upstream(self) -> ssl.SSLContext:
        """How the proxy checks a host it intercepts: the host's trust store, and
        [network] upstream_ca_file when set."""
        if self._upstream is None:
            context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
            context.set_alpn_protocols(["http/1.1"])
            if self._config.upstream_ca_file:
                try:
                    context.load_verify_locations(cafile=self._config.upstream_ca_file)
                except (OSError, ssl.SSLError) as exc:
                    raise ConfigError(f"network.upstream_ca_file: cannot load it: {exc}") from exc
            self._upstream = context
        return self._upstream

    def _plan(self, sid: str) -> links.LinkPlan:
        c = self._config
        return links.LinkPlan.for_subnet(
            self._prefix + sid, c.subnet, c.proxy_port, c.bandwidth_kbit
        )

    async def attach(
        self,
        key: str,
        sid: str,
        container_pid: int,
        allowlist: Allowlist,
        *,
        broker: Broker | None = None,
    ) -> None:
        """Build the sandbox's link and serve its proxy (with its brokered secrets: the
        proxy intercepts their hosts); SandboxBroken when that fails."""
        broker = broker or Broker()
        await self.detach(sid)
        if os.geteuid() != 0:
            raise SandboxBroken(
                "network mode egress needs the supervisor to run as root "
                "(it builds the sandbox's link with CAP_NET_ADMIN and CAP_SYS_ADMIN)"
            )
        try:
            sock = await asyncio.to_thread(links.build, self._plan(sid), container_pid)
        except links.LinkError as exc:
            raise SandboxBroken(f"sandbox {shown(key)!r}: {exc}") from exc
        proxy = self.new_proxy(key, allowlist, broker)
        try:
            await proxy.start(sock)
        except BaseException:
            sock.close()
            raise
        self._proxies[sid] = proxy

    def new_proxy(
        self, key: str, allowlist: Allowlist, broker: Broker | None = None
    ) -> EgressProxy:
        """A proxy for key's connections with this configuration's settings and hooks, not
        yet serving a socket (attach serves it on the sandbox's link; the pods' shared
        listener hands it connections)."""
        broker = broker or Broker()
        hooks = self._hooks
        return EgressProxy(
            key,
            allowlist,
            self._settings,
            self._record,
            broker=broker,
            authority=self.authority() if broker.secrets else None,
            upstream_context=self.upstream() if broker.secrets else None,
            record_injection=hooks.record_injection,
            tripwire=hooks.tripwire,
            alarm=hooks.alarm,
        )

    def broker_of(self, sid: str) -> Broker | None:
        """The Broker the sandbox's proxy holds now (None: no proxy of its here)."""
        proxy = self._proxies.get(sid)
        return proxy.broker if proxy is not None else None

    def rebroker(self, sid: str, broker: Broker) -> None:
        """Give the sandbox's proxy a reloaded Broker (proxy.py rebroker)."""
        proxy = self._proxies.get(sid)
        if proxy is not None:
            proxy.rebroker(broker)

    async def detach(self, sid: str) -> None:
        """Stop the proxy and remove the link (no error when there is none)."""
        proxy = self._proxies.pop(sid, None)
        if proxy is not None:
            await proxy.close()
        await asyncio.to_thread(links.remove, self._prefix + sid)

    async def prune(self, keep: set[str]) -> None:
        """Remove helper namespaces of this instance whose sandbox is gone."""
        for name in await asyncio.to_thread(links.namespaces, self._prefix):
            if name[len(self._prefix) :] not in keep:
                await asyncio.to_thread(links.remove, name)

    async def remove_instance(self, instance_id: str) -> None:
        """Remove the helper namespaces another, ended, instance left behind."""
        prefix = links.instance_prefix(instance_id)
        if prefix == self._prefix:
            return
        for name in await asyncio.to_thread(links.namespaces, prefix):
            await asyncio.to_thread(links.remove, name)

    async def close(self) -> None:
        """Stop serving; the links stay until the next start rebuilds them."""
        for proxy in self._proxies.values():
            await proxy.close()
        self._proxies.clear()
