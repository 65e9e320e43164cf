"""A Kubernetes cluster for tests, made of two real parts: kmock's API emulator (a real HTTP
server that stores objects and streams watches) and a small kubelet of the tests' own that
runs each pod stored there under Podman's Kubernetes YAML runner (`podman kube play`).

No Kubernetes server can run on these machines; this is the nearest honest thing. What the
kubelet does for a pod, as a node's kubelet would:

- its Secrets, those it mounts and those its environment references (secretKeyRef), are
  read from the API and given to the pod (podman_kubelet.py);
- its volumes are played as a kubelet plays them (podman_kubelet.py: Podman 4.3 cannot play
  Secret volumes or emptyDirs right): Secrets and memory emptyDirs as tmpfs mounts of their
  own, disk emptyDirs as folders, all removed with the pod; a claim (persistentVolumeClaim) is
  the Podman volume of the claim's name, which outlives the pod, as a claim does;
- the pod gets a loopback address of its own (127.0.0.N: all of 127/8 is loopback) on which
  its container ports are published: the test's traffic never leaves loopback;
- once the agent port accepts connections, the pod's status says Running, Ready, podIP
  127.0.0.N; when its container exits, Failed (or Succeeded) with the exit code;
- a pod deleted from the API is removed from Podman.

What it does not do, and a real cluster would: schedule, enforce NetworkPolicies, apply
seccompProfile, runtimeClassName, ephemeral-storage and pids limits (podman_kubelet.py)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.integration import podman_kubelet
from tests.unit.kube_mock import kubeconfig_of

PODMAN = "podman"
POLL_S = 0.1
FIRST_HOST = 2
"""127.0.0.1 is left to everything else on the machine."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class MockApi:
    """kmock's Kubernetes emulator serving on 127.0.0.1 in a thread of its own."""

    port: int = field(default_factory=free_port)
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _stop: asyncio.Event | None = None
    emulator: Any = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        ready = threading.Event()
        failed: list[BaseException] = []

        async def serve() -> None:
            import kmock

            self._stop = asyncio.Event()
            try:
                async with (
                    kmock.KubernetesEmulator() as emulator,
                    kmock.Server(emulator, port=self.port),
                ):
                    self.emulator = emulator
                    ready.set()
                    await self._stop.wait()
            except BaseException as exc:
                failed.append(exc)
                ready.set()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            try:
                self._loop.run_until_complete(serve())
            finally:
                self._loop.close()

        self._thread = threading.Thread(target=run, name="kmock", daemon=True)
        self._thread.start()
        if not ready.wait(30) or failed:
            raise RuntimeError(f"kmock did not start: {failed}")

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)

    def kubeconfig(self, path: Path, namespace: str) -> Path:
        """A kubeconfig that points the official client at the emulator."""
        config = kubeconfig_of(self.url, namespace, "tests", "kmock-accepts-any-token")
        path.write_text(json.dumps(config), encoding="utf-8")  # JSON is YAML
        return path

    def request(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/merge-patch+json"} if method == "PATCH" else {}
        if method == "POST":
            headers = {"Content-Type": "application/json"}
        req = urllib.request.Request(self.url + path, data, headers, method=method)
        with urllib.request.urlopen(req, timeout=10) as reply:
            return json.loads(reply.read() or b"null")


@dataclass
class Played:
    name: str
    address: str
    pod: podman_kubelet.PlayedPod | None = None
    ready: bool = False
    ended: bool = False


class Kubelet:
    """Runs the pods of one namespace of a MockApi under Podman (see the module's text)."""

    def __init__(self, api: MockApi, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        self.pods: dict[str, Played] = {}
        self.errors: list[str] = []
        self.claims: set[str] = set()
        self._next_host = FIRST_HOST
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kubelet", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        for played in list(self.pods.values()):
            self._remove(played)
        for claim in self.claims:
            podman_kubelet.remove_claim(claim)

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                self._sync()
            except Exception as exc:  # keep serving; the test reads `errors`
                self.errors.append(f"{type(exc).__name__}: {exc}")

    def _sync(self) -> None:
        listed = self.api.request("GET", f"/api/v1/namespaces/{self.namespace}/pods")
        items = {item["metadata"]["name"]: item for item in listed.get("items", [])}
        for name, played in list(self.pods.items()):
            if name not in items:
                self._remove(played)
        for name, pod in items.items():
            known = self.pods.get(name)
            if known is not None and (known.ready or known.ended) and not pod.get("status"):
                self._remove(known)  # deleted and made again under its name between two polls
                known = None
            if known is None:
                self.pods[name] = self._play(pod)
            elif not known.ended:
                self._report(pod, known)

    def _play(self, pod: dict[str, Any]) -> Played:
        """Run the pod with its Secrets and claims (podman_kubelet.py plays the volumes as a
        kubelet does), its container ports published on a loopback address of its own."""
        name = pod["metadata"]["name"]
        played = Played(name, f"127.0.0.{self._next_host}")
        self._next_host += 1
        local = copy.deepcopy(pod)
        local.pop("status", None)
        wanted: set[str] = set()
        for volume in local["spec"].get("volumes", []):
            if "secret" in volume:
                wanted.add(volume["secret"]["secretName"])
            elif "persistentVolumeClaim" in volume:
                self.claims.add(volume["persistentVolumeClaim"]["claimName"])
        for container in local["spec"].get("containers", []):
            for env in container.get("env", []):
                ref = (env.get("valueFrom") or {}).get("secretKeyRef")
                if ref is not None:
                    wanted.add(ref["name"])
        secrets = {
            name: self.api.request("GET", f"/api/v1/namespaces/{self.namespace}/secrets/{name}")
            for name in sorted(wanted)
        }
        for container in local["spec"].get("containers", []):
            for port in container.get("ports", []):
                port["hostIP"] = played.address
                port["hostPort"] = port["containerPort"]
        try:
            played.pod = podman_kubelet.play(local, secrets)
        except Exception as exc:
            self.errors.append(f"kube play {name}: {str(exc)[-2000:]}")
            self._set_status(name, {"phase": "Failed", "reason": "KubePlayFailed"})
            played.ended = True
        return played

    def _report(self, pod: dict[str, Any], played: Played) -> None:
        state = self._container_state(played.name)
        if state is None:
            return
        status, code = state
        if status in ("exited", "stopped"):
            phase = "Succeeded" if code == 0 else "Failed"
            self._set_status(
                played.name,
                {"phase": phase, "conditions": [{"type": "Ready", "status": "False"}]},
            )
            played.ended = True
            return
        if not played.ready and status == "running" and self._answers(pod, played):
            self._set_status(
                played.name,
                {
                    "phase": "Running",
                    "podIP": played.address,
                    "podIPs": [{"ip": played.address}],
                    "conditions": [{"type": "Ready", "status": "True"}],
                },
            )
            played.ready = True

    def _answers(self, pod: dict[str, Any], played: Played) -> bool:
        """Its readiness probe (a tcpSocket probe on a port) passes."""
        for container in pod["spec"].get("containers", []):
            probe = container.get("readinessProbe", {}).get("tcpSocket")
            if probe is None:
                continue
            with (
                contextlib.suppress(OSError),
                socket.create_connection((played.address, int(probe["port"])), timeout=0.5),
            ):
                return True
            return False
        return True

    def _container_state(self, name: str) -> tuple[str, int] | None:
        """The first app container's status and exit code; None when Podman has none."""
        done = subprocess.run([PODMAN, "pod", "inspect", name], capture_output=True, text=True)
        if done.returncode != 0:
            return None
        info = json.loads(done.stdout)
        info = info[0] if isinstance(info, list) else info
        infra = info.get("InfraContainerID", "")
        for container in info.get("Containers", []):
            if container.get("Id") == infra:
                continue
            inspected = subprocess.run(
                [PODMAN, "inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}",
                 container["Id"]],
                capture_output=True, text=True,
            )  # fmt: skip
            if inspected.returncode != 0:
                return None
            status, code = inspected.stdout.split()
            return status, int(code)
        return None

    def _set_status(self, name: str, status: dict[str, Any]) -> None:
        with contextlib.suppress(urllib.error.HTTPError):  # deleted meanwhile
            self.api.request(
                "PATCH",
                f"/api/v1/namespaces/{self.namespace}/pods/{name}/status",
                {"status": status},
            )

    def _remove(self, played: Played) -> None:
        if played.pod is not None:
            podman_kubelet.down(played.pod)
        self.pods.pop(played.name, None)

    def wait_ready(self, name: str, timeout: float = 60.0) -> Played:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            played = self.pods.get(name)
            if played is not None and (played.ready or played.ended):
                return played
            time.sleep(POLL_S)
        raise TimeoutError(
            f"pod {name} not ready in {timeout:.0f} s; kubelet errors: {self.errors}"
        )


@contextlib.contextmanager
def cluster(namespace: str = "stockade") -> Iterator[tuple[MockApi, Kubelet, Path]]:
    """kmock and the kubelet, and a kubeconfig for them; everything removed afterwards."""
    api = MockApi()
    api.start()
    kubelet = Kubelet(api, namespace)
    kubelet.start()
    folder = Path(tempfile.mkdtemp(prefix="stockade-kube-"))
    try:
        yield api, kubelet, api.kubeconfig(folder / "kubeconfig", namespace)
    finally:
        kubelet.stop()
        api.stop()
        shutil.rmtree(folder, ignore_errors=True)
