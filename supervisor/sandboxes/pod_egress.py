"""Whose is a connection to the egress listener: the sandbox pod of that IP, through the
backend (engine.kind kubernetes; network/shared_proxy.py serves the connections).

Any replica serves any pod's connection, so no replica's own registry can answer; the pods
themselves can: each carries its key, tenant, network mode and allowlist (labels, or
annotations where a value cannot be a label: engines/backends/kubernetes/manifests.py), set by the
supervisor that made it and out of the sandbox's reach (a pod has no API token). The directory is
one list of this installation's pods by label, kept as address -> pod:

- a hit younger than MAX_AGE_S is answered from it;
- a miss, or an older hit, lists the pods again, at most once every MIN_REFRESH_S: a miss
  within that time of the last list waits for the next, which every miss meanwhile shares
  (a pod made a moment ago is found; an unknown source cannot make more API requests than
  one a second, however many connections it opens);
- only running pods with an IP count, at most MAX_PODS of them.

A pod's mode and allowlist are checked again against today's configuration (Networks.choose):
a pod made wider than this supervisor allows is refused, as adoption would replace it. An IP
reused by a new pod within MAX_AGE_S of the old pod's end is the window in which the old
pod's entry may answer for it (docs/kubernetes.md)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping

from stockade.supervisor.config.allowlist import Allowlist
from stockade.supervisor.engines.backends.base import (
    LABEL_NETWORK,
    LABEL_NETWORK_ALLOW,
    ContainerInfo,
)
from stockade.supervisor.errors import StockadeError
from stockade.supervisor.keys import shown
from stockade.supervisor.models import NetworkRequest
from stockade.supervisor.network.shared_proxy import Client, Refusal, source_address
from stockade.supervisor.sandboxes.sandbox import SandboxNetwork, labelled_key

log = logging.getLogger("stockade.egress")

MAX_AGE_S = 10.0
MIN_REFRESH_S = 1.0
MAX_PODS = 100_000

ListPods = Callable[[Mapping[str, str]], list[ContainerInfo]]
"""The backend's list (blocking): pods carrying all of the labels."""
Choose = Callable[[NetworkRequest], SandboxNetwork]
"""Networks.choose: the network a request may have today, or an error saying why not."""


class PodDirectory:
    def __init__(
        self,
        list_pods: ListPods,
        labels: Mapping[str, str],
        choose: Choose,
        ports: tuple[int, ...],
        *,
        max_age_s: float = MAX_AGE_S,
        min_refresh_s: float = MIN_REFRESH_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._list = list_pods
        self._labels = dict(labels)
        self._choose = choose
        self._ports = ports
        self._max_age_s = max_age_s
        self._min_refresh_s = min_refresh_s
        self._clock = clock
        self._pods: dict[str, ContainerInfo] = {}
        self._listed_at: float | None = None
        self._lock = asyncio.Lock()
        self.lists = 0
        """How many times the pods were listed (what an unknown source can cost)."""

    async def identify(self, address: str) -> Client | Refusal:
        """The sandbox whose pod has `address`, or why its connection is refused."""
        address = source_address((address,))
        asked_at = self._clock()
        pod = self._pods.get(address) if self._fresh() else None
        if pod is None:
            try:
                await self._refresh(asked_at)
            except StockadeError as exc:
                return Refusal(503, f"the pods cannot be listed to know {address}: {exc}")
            pod = self._pods.get(address)
        if pod is None:
            return Refusal(403, f"{address or '?'} is no running sandbox pod of this installation")
        return self._client(pod, address)

    def _fresh(self) -> bool:
        return self._listed_at is not None and self._clock() - self._listed_at < self._max_age_s

    async def _refresh(self, asked_at: float) -> None:
        """List the pods again, unless another call did since `asked_at`; not sooner than
        MIN_REFRESH_S after the last list (waited for, the lock held: the calls waiting for
        the lock meanwhile take this list)."""
        async with self._lock:
            if self._listed_at is not None:
                if self._listed_at >= asked_at:
                    return
                wait = self._listed_at + self._min_refresh_s - self._clock()
                if wait > 0:
                    await asyncio.sleep(wait)
            self.lists += 1
            found = await asyncio.to_thread(self._list, self._labels)
            pods: dict[str, ContainerInfo] = {}
            for info in found:
                if info.running and info.address and len(pods) < MAX_PODS:
                    pods[source_address((info.address,)) or info.address] = info
            if len(found) > MAX_PODS:
                log.warning("egress: more than %d pods; the others are not served", MAX_PODS)
            self._pods, self._listed_at = pods, self._clock()

    def _client(self, pod: ContainerInfo, address: str) -> Client | Refusal:
        key = labelled_key(pod.labels)
        if not key:
            return Refusal(403, f"pod {pod.name} at {address} names no sandbox key")
        mode = pod.labels.get(LABEL_NETWORK, "none")
        if mode != "egress":
            reason = (
                f"sandbox {shown(key)!r} (pod {pod.name}) is in network mode {mode[:16]!r}, "
                "not egress: it has no way out through the proxy"
            )
            return Refusal(403, reason, key)
        allow = tuple(p for p in pod.labels.get(LABEL_NETWORK_ALLOW, "").split(",") if p)
        try:
            network = self._choose(NetworkRequest("egress", allow))
        except StockadeError as exc:
            reason = f"sandbox {shown(key)!r}: its pod's network is not allowed now: {exc}"
            return Refusal(403, reason, key)
        return Client(key, Allowlist(network.allow, self._ports))
