"""Egress for the sandbox manager: per sandbox, the link (links.py) and its proxy (proxy.py).
The manager calls attach() once the container runs (again after adoption: the link is
rebuilt, since the proxy's listening socket died with the previous supervisor) and detach()
when the container goes."""

from __future__ import annotations

import asyncio
import os

from stockade.supervisor.config import NetworkConfig
from stockade.supervisor.errors import SandboxBroken
from stockade.supervisor.keys import shown
from stockade.supervisor.network import links
from stockade.supervisor.network.allowlist import Allowlist, canonical_host
from stockade.supervisor.network.proxy import EgressProxy, ProxySettings, Recorder


class EgressNetwork:
    def __init__(self, config: NetworkConfig, instance_id: str, record: Recorder) -> None:
        self._config = config
        self._prefix = links.instance_prefix(instance_id)
        self._record = record
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
        self.environment = {**values, **{k.lower(): v for k, v in values.items()}}
        """What programs in the sandbox read to find the proxy (both spellings: curl reads
        only the lower-case http_proxy)."""

    def _plan(self, sid: str) -> links.LinkPlan:
        c = self._config
        return links.LinkPlan.for_subnet(
            self._prefix + sid, c.subnet, c.proxy_port, c.bandwidth_kbit
        )

    async def attach(self, key: str, sid: str, container_pid: int, allowlist: Allowlist) -> None:
        """Build the sandbox's link and serve its proxy; SandboxBroken when that fails."""
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
        proxy = EgressProxy(key, allowlist, self._settings, self._record)
        try:
            await proxy.start(sock)
        except BaseException:
            sock.close()
            raise
        self._proxies[sid] = proxy

    def new_proxy(self, key: str, allowlist: Allowlist) -> EgressProxy:
        """A proxy for key's connections with this configuration's settings, not serving
        any socket of its own (the pods' shared listener hands it connections)."""
        return EgressProxy(key, allowlist, self._settings, self._record)

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
