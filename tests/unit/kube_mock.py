"""A Kubernetes API server for tests: kmock's emulator (objects kept in memory, served over real
HTTP on 127.0.0.1 with lists, watches, creates, patches and deletes) in a thread of its own,
so that blocking code (the backend, the official client) can talk to it from the test's
thread. The test plays the kubelet: it patches a pod's status to Ready with an IP.
kube_manager is the real SandboxManager on the real KubernetesBackend against it.

kmock, as emulators go: it ignores label and field selectors (the backend filters again on
its side), keeps no resourceVersion (a test sets one in the object where it matters), and
asks the client for /version without the trailing slash the official client sends (served
here)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import kmock

from stockade.supervisor.config import Config, EngineConfig, HousekeepingConfig, SandboxConfig
from stockade.supervisor.config.sandbox import KubernetesConfig
from stockade.supervisor.engines.backends.kubernetes.api import KubeApi, Timeouts, load_client
from stockade.supervisor.engines.backends.kubernetes.backend import KubernetesBackend
from stockade.supervisor.sandboxes.manager import SandboxManager

NAMESPACE = "stockade"
VERSION = {"major": "1", "minor": "30", "gitVersion": "v1.30.0-kmock"}


class KubeMock:
    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._up = threading.Event()
        self._stop: asyncio.Event | None = None
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="kmock", daemon=True)
        self._thread.start()
        if not self._up.wait(10) or self._failure is not None:
            raise RuntimeError(f"kmock did not start: {self._failure}")

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve())
        except BaseException as exc:  # reported by __init__ or close
            self._failure = exc
            self._up.set()
        finally:
            self._loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        async with kmock.KubernetesEmulator() as handler, kmock.Server(handler) as server:
            self.handler = handler
            self.url = str(server.url).rstrip("/")
            handler["get /version/"] << VERSION
            for plural in RESOURCES.values():  # listed empty before any is made, as a server does
                handler.resources[f"v1/{plural}"] = {}
            self._up.set()
            await self._stop.wait()

    def close(self) -> None:
        stop = self._stop
        if stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(stop.set)
        self._thread.join(10)

    def react(self, arrange: Callable[[Any], object]) -> None:
        """Run `arrange(handler)` in the server's loop: where kmock's reactions are added."""

        async def run() -> None:
            arrange(self.handler)

        asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    def requests(self) -> list[tuple[str, str]]:
        """(method, path?query) of every request served so far, the query decoded."""

        async def run() -> list[tuple[str, str]]:
            found = []
            for request in list(self.handler):
                url = request.url
                query = unquote(url.raw_query_string)
                found.append((str(request.method.value), url.path + (f"?{query}" if query else "")))
            return found

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    def _http(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        async def run() -> tuple[int, Any]:
            async with self.handler.request(method, path, json=body) as response:
                text = await response.text()
                return response.status, json.loads(text) if text else None

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    def put(self, kind: str, body: dict[str, Any]) -> None:
        """Create an object as something else than the backend would (another supervisor)."""
        status, answer = self._http("POST", _path(kind), body)
        assert status in (200, 201), answer

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        status, answer = self._http("GET", _path(kind, name))
        return answer if status == 200 else None

    def names(self, kind: str) -> list[str]:
        status, answer = self._http("GET", _path(kind))
        assert status == 200, answer
        return sorted(item["metadata"]["name"] for item in answer["items"])

    def patch(self, kind: str, name: str, body: dict[str, Any], sub: str = "") -> None:
        status, answer = self._http("PATCH", _path(kind, name) + (f"/{sub}" if sub else ""), body)
        assert status == 200, answer

    def set_ready(self, name: str, ip: str = "127.0.0.5", version: str = "") -> None:
        """The kubelet's part: the pod runs, has an IP and is Ready."""
        status = {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True"}],
        }
        body: dict[str, Any] = {"status": status}
        if version:
            body["metadata"] = {"resourceVersion": version}
        self.patch("pod", name, body, "status")

    def kubeconfig(self, folder: Path) -> Path:
        """A kubeconfig file whose current context is this server."""
        path = folder / "kubeconfig"
        path.write_text(json.dumps(kubeconfig_of(self.url, NAMESPACE, "test", "not-a-secret")))
        return path


def kubeconfig_of(server: str, namespace: str, user: str, token: str) -> dict[str, Any]:
    """A kubeconfig (as JSON, which is YAML) whose one context, "kmock", is `server` in
    `namespace` as `user` with bearer `token`."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kmock", "cluster": {"server": server}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [
            {"name": "kmock", "context": {"cluster": "kmock", "user": user, "namespace": namespace}}
        ],
        "current-context": "kmock",
    }


RESOURCES = {"pod": "pods", "secret": "secrets", "claim": "persistentvolumeclaims"}


def ca_secret(name: str = "stockade-agent-ca") -> dict[str, Any]:
    """The installation CA's Secret (kubernetes.ca_secret), of a CA made afresh."""
    from stockade.supervisor.engines.backends.kubernetes.pki import Authority

    authority = Authority.create()
    data = {"tls.crt": authority.cert_pem, "tls.key": authority.key_pem}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {"name": name},
        "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
    }


def _path(kind: str, name: str = "") -> str:
    path = f"/api/v1/namespaces/{NAMESPACE}/{RESOURCES[kind]}"
    return f"{path}/{name}" if name else path


@contextlib.contextmanager
def serving() -> Iterator[KubeMock]:
    """A KubeMock for the block (a test module's `kube` fixture)."""
    mock = KubeMock()
    try:
        yield mock
    finally:
        mock.close()


class Kubelet:
    """The kubelet's part for every pod made in the mock, on a thread: a pod gets its agent
    (with `agents`, the real one, a subprocess on 127.0.0.N:port, run with the pod's own
    agent options and the certificates of the pod's Secret), then Ready with podIP
    127.0.0.N; a deleted pod's agent is stopped. Without `agents`, pods only turn Ready."""

    def __init__(self, mock: KubeMock, root: Path, port: int, *, agents: bool = True) -> None:
        self._mock, self._root, self._port, self._agents = mock, root, port, agents
        self.played: dict[str, str] = {}
        """pod name -> the IP it was given (while it exists)."""
        self._running: dict[str, subprocess.Popen[bytes]] = {}
        self._made = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kubelet", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(0.05):
            names = set(self._mock.names("pod"))
            for name in sorted(names):
                pod = self._mock.get("pod", name)
                if pod is not None and not pod.get("status"):  # new (maybe of an old name)
                    if name in self._running:
                        self._end(name)
                    self._play(name, pod)
            for name in sorted(set(self.played) - names):  # deleted: a new one may come
                del self.played[name]
                if name in self._running:
                    self._end(name)

    def _play(self, name: str, pod: dict[str, Any]) -> None:
        self._made += 1
        ip = f"127.0.0.{self._made + 1}"
        self.played[name] = ip
        if self._agents:
            self._running[name] = self._start_agent(name, pod, ip)
        try:
            self._mock.set_ready(name, ip)
        except AssertionError:
            if self._mock.get("pod", name) is not None:
                raise
            # deleted while it started (a start given up): the loop sees it gone, ends its agent

    def _start_agent(self, name: str, pod: dict[str, Any], ip: str) -> subprocess.Popen[bytes]:
        container = pod["spec"]["containers"][0]
        secret_name = next(
            v["secret"]["secretName"] for v in pod["spec"]["volumes"] if "secret" in v
        )
        secret = self._mock.get("secret", secret_name)
        assert secret is not None, f"pod {name} came before its Secret"
        # the workspace outlives the pod when it is a claim (one folder per claim), not when
        # it is an emptyDir (one per pod); the Secret's files are the pod's own
        volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "workspace")
        claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
        workspace = self._root / (claim or f"{name}-{self._made}")
        workspace.mkdir(parents=True, exist_ok=True)
        tls = self._root / f"{name}-{self._made}-tls"
        tls.mkdir(parents=True)
        for file, data in secret["data"].items():
            (tls / file).write_bytes(base64.b64decode(data))
        command = list(container["command"])
        module = command.index("stockade.agent")
        agent_start = ["/usr/bin/tini", "--", "python3", "-P", "-m", "stockade.agent"]
        assert command[: module + 1] == agent_start
        local = {
            "--listen": f"{ip}:{self._port}",
            "--tls-dir": str(tls),
            "--workspace": str(workspace),
        }
        args = command[module + 1 :]
        for flag, value in local.items():
            args[args.index(flag) + 1] = value
        agent = subprocess.Popen([sys.executable, "-m", "stockade.agent", *args])
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as probe:
                if probe.connect_ex((ip, self._port)) == 0:
                    return agent
            if agent.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the agent of pod {name} did not listen on {ip}")
            time.sleep(0.05)

    def kill(self, name: str) -> None:
        """The pod's agent dies (the OOM killer, say): its process ends and the pod fails."""
        self._end(name)
        died = {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}
        status = {
            "phase": "Failed",
            "conditions": [{"type": "Ready", "status": "False"}],
            "containerStatuses": [{"name": "sandbox", "state": died}],
        }
        self._mock.patch("pod", name, {"status": status}, "status")

    def _end(self, name: str) -> None:
        agent = self._running.pop(name)
        agent.terminate()
        agent.wait(10)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        for name in list(self._running):
            self._end(name)


FAST = Timeouts(connect_s=2, read_s=5, attempts=3, backoff_s=0.05, watch_window_s=5)


def kube_manager(
    kube: KubeMock,
    tmp_path: Path,
    port: int,
    *,
    state: str = "state",
    replica: str = "",
    housekeeping: HousekeepingConfig | None = None,
    **sandbox: Any,
) -> SandboxManager:
    """The real SandboxManager of instance inst0001aaaa on a KubernetesBackend against `kube`,
    its agents on `port` (the test kubelet's), its state in tmp_path / `state`; `sandbox`:
    SandboxConfig's settings besides the user and tmp_inodes."""
    kubernetes = KubernetesConfig(
        namespace=NAMESPACE,
        kubeconfig=str(kube.kubeconfig(tmp_path)),
        agent_port=port,
        ready_timeout_s=60,
    )
    config = Config(
        state_dir=tmp_path / state,
        engine=EngineConfig(kind="kubernetes"),
        kubernetes=kubernetes,
        sandbox=SandboxConfig(user="65532:65532", tmp_inodes=0, **sandbox),
        housekeeping=housekeeping or HousekeepingConfig(),
    )
    backend = KubernetesBackend(kubernetes, KubeApi(load_client(kubernetes), NAMESPACE, FAST))
    return SandboxManager(
        config,
        backend,
        instance_id="inst0001aaaa",
        image="stockade-sandbox:test",
        address_of=backend.address_of,
        host_mounts=False,
        replica=replica,
    )
