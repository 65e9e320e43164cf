"""A sandbox as a pod, through the real sandbox manager: KubernetesBackend against kmock, the
test kubelet starting the real agent for each pod (on 127.0.0.N, with the certificate of the
pod's Secret), and every call reaching it over mutual TLS at the pod's IP. Then a restart
adopts the pod, and destroying the sandbox with its workspace deletes its claim."""

from __future__ import annotations

from pathlib import Path

import pytest

from stockade.supervisor.errors import Quarantined, Unsupported
from stockade.supervisor.keys import sandbox_id
from stockade.supervisor.models import NetworkRequest
from stockade.supervisor.observe.alarms import Alarm
from stockade.supervisor.sandboxes.manager import SandboxManager
from tests.unit.kube_mock import NAMESPACE, Kubelet, KubeMock, kube_manager

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("kube_ca")]


async def _exec(mgr: SandboxManager, key: str, command: str) -> str:
    async with mgr.lease(key) as lease:
        reply = await lease.invoke("exec", {"command": command}, 30.0, "rid", deadline="agent")
    assert reply.error_code == "", reply
    assert reply.result is not None
    return str(reply.result["stdout"])


async def test_a_sandbox_is_a_pod_reached_over_mutual_tls(
    kube: KubeMock, kubelet: Kubelet, tmp_path: Path, port: int
) -> None:
    sid = sandbox_id("k")
    pod = f"stockade-inst0001-{sid}"
    first = kube_manager(kube, tmp_path, port)
    await first.start()
    try:
        assert await _exec(first, "k", "echo kept > notes.txt && cat notes.txt") == "kept\n"
        held = first.registry["k"]
        assert held.info.address == kubelet.played[pod]
        # the file is in the pod's workspace (the kubelet's folder for its claim), not the
        # host folder
        claim = tmp_path / "nodes" / f"stockade-ws-{sid}"
        assert (claim / "notes.txt").read_text() == "kept\n"
        assert not (tmp_path / "state" / "sandboxes" / sid / "workspace" / "notes.txt").exists()
        with pytest.raises(Unsupported, match="cannot be paused"):
            await first.pause("k", "a test")
        assert not first.registry["k"].paused
        assert not first.registry["k"].lost
        # a quarantine cannot freeze a pod: it says so, and refuses its calls all the same
        alarm = Alarm("k", "guard", "operator", "a test")
        record = await first.quarantines.quarantine("k", alarm)
        assert not record.frozen
        assert "not frozen" in record.note
        with pytest.raises(Quarantined):
            await _exec(first, "k", "cat notes.txt")
        await first.quarantines.release("k")
        assert await _exec(first, "k", "cat notes.txt") == "kept\n"
    finally:
        await first.close()

    second = kube_manager(kube, tmp_path, port)  # a restart: the running pod is adopted
    assert await second.start() == ["k"]
    try:
        assert await _exec(second, "k", "cat notes.txt") == "kept\n"
        assert kube.names("pod") == [pod]
        removed, deleted = await second.destroy("k", delete_workspace=True)
    finally:
        await second.close()
    assert (removed, deleted) == (True, True)
    assert kube.names("pod") == []
    assert kube.names("secret") == ["stockade-agent-ca"]
    assert kube.names("claim") == []


async def test_destroy_keeps_the_claim_unless_asked(
    kube: KubeMock, kubelet: Kubelet, tmp_path: Path, port: int
) -> None:
    mgr = kube_manager(kube, tmp_path, port)
    await mgr.start()
    try:
        assert await _exec(mgr, "k", "id -u") == "0\n"  # the test's agent runs as itself
        assert await mgr.destroy("k", delete_workspace=False) == (True, False)
        assert kube.names("pod") == []
        assert kube.names("claim") == [f"stockade-ws-{sandbox_id('k')}"]
    finally:
        await mgr.close()


async def test_a_dead_pod_is_made_again_on_its_claim(
    kube: KubeMock, kubelet: Kubelet, tmp_path: Path, port: int
) -> None:
    pod = f"stockade-inst0001-{sandbox_id('k')}"
    mgr = kube_manager(kube, tmp_path, port)
    await mgr.start()
    try:
        await _exec(mgr, "k", "echo before > notes.txt")
        first_ip = kubelet.played[pod]
        kubelet.kill(pod)
        info = await mgr.get("k")
        assert info.state.name == "EXITED"
        assert await _exec(mgr, "k", "cat notes.txt") == "before\n"  # a new pod, same claim
        assert kubelet.played[pod] != first_ip
        assert mgr.registry["k"].info.address == kubelet.played[pod]
    finally:
        await mgr.close()


async def test_egress_cannot_be_asked_for_without_the_egress_service(
    kube: KubeMock, kubelet: Kubelet, tmp_path: Path, port: int
) -> None:
    """A request may narrow an open network to egress; a pod is told the egress Service as
    its proxy, so with none configured (kubernetes.egress_proxy) that is refused before
    anything is made (test_kube_egress.py: with one)."""
    mgr = kube_manager(kube, tmp_path, port, network="open")
    await mgr.start()
    try:
        with pytest.raises(Unsupported, match=r"'egress' on pods needs kubernetes\.egress_proxy"):
            await mgr.ensure("k", NetworkRequest(mode="egress"))
        assert kube.names("pod") == []
    finally:
        await mgr.close()


async def test_the_workspace_shown_is_the_claim(
    kube: KubeMock, kubelet: Kubelet, tmp_path: Path, port: int
) -> None:
    """Get and List name a pod's workspace by its claim, held or absent: the supervisor's host
    folder of the key holds none of its files."""
    claim = f"pvc://{NAMESPACE}/stockade-ws-{sandbox_id('k')}"
    mgr = kube_manager(kube, tmp_path, port)
    await mgr.start()
    try:
        await _exec(mgr, "k", "true")
        assert (await mgr.get("k")).workspace_path == claim
        assert await mgr.destroy("k", delete_workspace=False) == (True, False)
        absent = await mgr.get("k")
        assert (absent.state.name, absent.workspace_path) == ("ABSENT", claim)
        assert [i.workspace_path for i in await mgr.list()] == [claim]
    finally:
        await mgr.close()
