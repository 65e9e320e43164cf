"""The warm pool of pods, through the real sandbox manager: KubernetesBackend against kmock, the
test kubelet starting the real agent of each pod (on 127.0.0.N, with the certificate of the
pod's Secret). A pool pod is made ahead with a claim and a Secret of its own, marked with its
maker's replica id; a new key's first call claims it by relabeling (merge patches of its
claim and pod); the key's pod is found by its sandbox-id label from then on (another
replica's Get and Destroy, a heal that keeps the claim); another replica's pool is left
alone, a gone replica's reaped; a patch that fails (409, 500) costs the pool pod, not the
call."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from stockade.supervisor.config import HousekeepingConfig
from stockade.supervisor.config.sandbox import KubernetesConfig
from stockade.supervisor.engines.backends.base import (
    LABEL_KEY,
    LABEL_POOL,
    LABEL_REPLICA,
    LABEL_SANDBOX_ID,
    LABEL_TENANT,
)
from stockade.supervisor.engines.backends.kubernetes import manifests
from stockade.supervisor.errors import StateUnavailable
from stockade.supervisor.keys import sandbox_id, scope
from stockade.supervisor.sandboxes.manager import SandboxManager
from tests.unit.kube_mock import NAMESPACE, Kubelet, KubeMock, kube_manager
from tests.unit.test_kube_sandboxes import _exec

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("kube_ca")]
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
SID = sandbox_id("k")


def _manager(
    kube: KubeMock, tmp_path: Path, port: int, replica: str, *, pool: int = 1
) -> SandboxManager:
    return kube_manager(
        kube,
        tmp_path,
        port,
        state=f"state-{replica}",
        replica=replica,
        housekeeping=HousekeepingConfig(warm_pool=pool),
    )


async def _filled(mgr: SandboxManager, count: int, but: frozenset[str] = frozenset()) -> set[str]:
    """Wait until the pool holds `count` ready pods none of which is in `but`: their names."""
    deadline = time.monotonic() + 90
    while True:
        names = {p.info.name for p in mgr.pool.ready}
        if len(names) >= count and not names & but:
            return names
        assert time.monotonic() < deadline, f"the pool never filled: {names}"
        await asyncio.sleep(0.1)


def _labels(kube: KubeMock, kind: str, name: str) -> dict[str, str]:
    found = kube.get(kind, name)
    assert found is not None, f"{kind} {name} is gone"
    return manifests.carried_labels(found["metadata"])


def _volumes(kube: KubeMock, pod: str) -> tuple[str, str]:
    found = kube.get("pod", pod)
    assert found is not None
    return manifests.claim_of(found), manifests.secret_of(found)


async def test_the_pool_fills_and_a_new_key_claims_its_pod_by_relabeling(
    kube: KubeMock, kubelet: Kubelet, tmp_path: Path, port: int
) -> None:
    mgr = _manager(kube, tmp_path, port, "inst0001aaaa-r1")
    await mgr.start()
    mgr.pool.start()
    try:
        (pooled,) = await _filled(mgr, 1)
        pool_id = _labels(kube, "pod", pooled)[LABEL_POOL]
        ident = f"pool-{pool_id}"
        assert pooled == f"stockade-inst0001-{ident}"
        assert _volumes(kube, pooled) == (f"stockade-ws-{ident}", f"stockade-agent-{ident}")
        for kind, name in [("pod", pooled), ("claim", f"stockade-ws-{ident}")]:
            labels = _labels(kube, kind, name)
            assert labels[LABEL_REPLICA] == "inst0001aaaa-r1"
            assert LABEL_SANDBOX_ID not in labels
            assert LABEL_KEY not in labels
        assert kube.names("secret") == sorted(["stockade-agent-ca", f"stockade-agent-{ident}"])

        # the first call of a new key is served by that very pod, relabeled as the key's
        key = scope("acme", "k")
        assert await _exec(mgr, key, "echo mine > notes.txt && cat notes.txt") == "mine\n"
        sid = sandbox_id(key)
        held = mgr.registry[key]
        assert held.info.name == pooled
        assert held.info.address == kubelet.played[pooled]
        # (the test kubelet's own patches are of the pods' status)
        patched = [p for m, p in kube.requests() if m == "PATCH" and not p.endswith("/status")]
        # the claim, then the pod; never the Secret (a patch would answer with its data)
        assert patched == [
            f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims/stockade-ws-{ident}",
            f"{PODS}/{pooled}",
        ]
        pod = _labels(kube, "pod", pooled)
        assert (pod[LABEL_KEY], pod[LABEL_TENANT], pod[LABEL_SANDBOX_ID]) == ("k", "acme", sid)
        assert LABEL_REPLICA not in pod  # no replica's pool pod any more: a key's sandbox
        labels = _labels(kube, "claim", f"stockade-ws-{ident}")
        assert (labels[LABEL_SANDBOX_ID], labels[LABEL_KEY]) == (sid, "k")
        assert LABEL_REPLICA not in labels
        # the file is on the pool pod's claim, which is the key's workspace now
        assert (tmp_path / "nodes" / f"stockade-ws-{ident}" / "notes.txt").read_text() == "mine\n"
        assert (await mgr.get(key)).workspace_path == f"pvc://{NAMESPACE}/stockade-ws-{ident}"

        # the pool refills with another pod
        (again,) = await _filled(mgr, 1, frozenset({pooled}))
        assert again != pooled
        assert LABEL_SANDBOX_ID not in _labels(kube, "pod", again)
    finally:
        await mgr.close()
    # at close the unclaimed pool pod goes with its claim and Secret; the claimed one stays
    assert kube.names("pod") == [pooled]
    assert kube.names("claim") == [f"stockade-ws-{ident}"]


async def _abandon(mgr: SandboxManager) -> None:
    """The replica is killed: its filler stops, its pool pods stay where they are."""
    task = mgr.pool._task
    if task is not None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        mgr.pool._task = None
    mgr.pool.ready.clear()
    await mgr.close()


async def test_a_claimed_pod_is_found_by_its_label_adopted_destroyed_elsewhere(
    kube: KubeMock, kubelet: Kubelet, tmp_path: Path, port: int
) -> None:
    mgr = _manager(kube, tmp_path, port, "inst0001aaaa-r1")
    await mgr.start()
    mgr.pool.start()
    # two other replicas, started before the key's pod was made: neither adopted it
    other = _manager(kube, tmp_path, port, "inst0001aaaa-r2", pool=0)
    await other.start()
    last = _manager(kube, tmp_path, port, "inst0001aaaa-r4", pool=0)
    await last.start()
    try:
        (pooled,) = await _filled(mgr, 1)
        await _exec(mgr, "k", "echo kept > notes.txt")
        assert mgr.registry["k"].info.name == pooled
        # Get through a replica that never served the key holds the pod another made (found
        # by label, not by the key's pod name), and a call runs there
        assert "k" not in other.registry
        assert (await other.get("k")).state.name == "RUNNING"
        assert other.registry["k"].info.name == pooled
        assert await _exec(other, "k", "cat notes.txt") == "kept\n"

        # a restart adopts it by its labels
        again = _manager(kube, tmp_path, port, "inst0001aaaa-r3", pool=0)
        assert await again.start() == ["k"]
        assert again.registry["k"].info.name == pooled
        await again.close()

        # destroy through a replica without the sandbox: the pod by its label, its claim too
        assert "k" not in last.registry
        assert await last.destroy("k", delete_workspace=True) == (True, True)
        assert pooled not in kube.names("pod")
        assert _claim_of_pool_pod(pooled) not in kube.names("claim")
    finally:
        await last.close()
        await other.close()
        await mgr.close()
    assert kube.names("pod") == []  # the refilled pool pod went at close
    assert kube.names("claim") == []
    assert kube.names("secret") == ["stockade-agent-ca"]


def _claim_of_pool_pod(pod: str) -> str:
    return "stockade-ws-" + pod.removeprefix("stockade-inst0001-")


async def test_a_claimed_pod_that_dies_is_made_again_on_its_claim(
    kube: KubeMock, kubelet: Kubelet, tmp_path: Path, port: int
) -> None:
    mgr = _manager(kube, tmp_path, port, "inst0001aaaa-r1")
    await mgr.start()
    mgr.pool.start()
    try:
        (pooled,) = await _filled(mgr, 1)
        claim, secret = _volumes(kube, pooled)
        await _exec(mgr, "k", "echo before > notes.txt")
        assert mgr.registry["k"].info.name == pooled
        kubelet.kill(pooled)
        assert (await mgr.get("k")).state.name == "EXITED"
        assert await _exec(mgr, "k", "cat notes.txt") == "before\n"
        healed = f"stockade-inst0001-{SID}"
        assert mgr.registry["k"].info.name == healed  # the key's own name now
        assert _volumes(kube, healed) == (claim, f"stockade-agent-{SID}")  # the claim it had
        assert pooled not in kube.names("pod")
        assert secret not in kube.names("secret")  # the pool pod's certificate went with it
        assert _labels(kube, "pod", healed)[LABEL_SANDBOX_ID] == SID
    finally:
        await mgr.close()
    assert claim in kube.names("claim")


async def test_a_key_whose_claim_exists_does_not_take_a_pool_pod(
    kube: KubeMock, kubelet: Kubelet, tmp_path: Path, port: int
) -> None:
    """Its pod was made by another replica and pruned there, say: its claim is its workspace,
    so its new pod is made on it, and the pool pod stays in the pool."""
    labels = {
        "io.stockade.managed": "1",
        "io.stockade.instance": "inst0001aaaa",
        LABEL_SANDBOX_ID: SID,
    }
    kube.put("claim", manifests.workspace_claim("stockade-ws-old", KubernetesConfig(), labels))
    (tmp_path / "nodes" / "stockade-ws-old").mkdir(parents=True)
    (tmp_path / "nodes" / "stockade-ws-old" / "notes.txt").write_text("old\n")
    mgr = _manager(kube, tmp_path, port, "inst0001aaaa-r1")
    await mgr.start()
    mgr.pool.start()
    try:
        (pooled,) = await _filled(mgr, 1)
        assert await _exec(mgr, "k", "cat notes.txt") == "old\n"
        assert mgr.registry["k"].info.name == f"stockade-inst0001-{SID}"
        assert [p.info.name for p in mgr.pool.ready] == [pooled]
    finally:
        await mgr.close()


async def test_another_replicas_pool_is_left_alone_and_a_gone_ones_reaped(
    kube: KubeMock, kubelet: Kubelet, tmp_path: Path, port: int
) -> None:
    first = _manager(kube, tmp_path, port, "inst0001aaaa-r1", pool=2)
    await first.start()
    first.pool.start()
    second = _manager(kube, tmp_path, port, "inst0001aaaa-r2", pool=0)
    await second.start()
    try:
        mine = await _filled(first, 2)
        await _exec(first, "k", "true")  # claims one: a key's sandbox, never reaped
        claimed = first.registry["k"].info.name
        alive = frozenset({"inst0001aaaa-r1", "inst0001aaaa-r2"})

        async def both() -> frozenset[str]:
            return alive

        second.pool._replicas = both
        assert await second.pool.reap() == 0
        assert mine <= set(kube.names("pod"))
        # the second replica never claims the first's pool pods: a new key gets its own pod
        await _exec(second, "j", "true")
        assert second.registry["j"].info.name == f"stockade-inst0001-{sandbox_id('j')}"
        await _filled(first, 2, frozenset({claimed}))  # its filler idle: nothing half made
    finally:
        await _abandon(first)  # its heartbeat stops too (below)

    async def gone() -> frozenset[str]:
        return frozenset({"inst0001aaaa-r2"})  # the first replica's heartbeat stopped

    try:
        second.pool._replicas = gone
        leftover = {n for n in kube.names("pod") if n.startswith("stockade-inst0001-pool-")}
        unclaimed = leftover - {claimed}
        assert unclaimed
        assert await second.pool.reap() == len(unclaimed)
        assert set(kube.names("pod")) == {claimed, f"stockade-inst0001-{sandbox_id('j')}"}
        # with their claims and Secrets; the claimed pod's stay
        idents = {n.removeprefix("stockade-inst0001-") for n in unclaimed | {claimed}}
        kept = claimed.removeprefix("stockade-inst0001-")
        owned = {f"stockade-ws-{i}" for i in idents} & set(kube.names("claim"))
        assert owned == {f"stockade-ws-{kept}"}
        owned = {f"stockade-agent-{i}" for i in idents} & set(kube.names("secret"))
        assert owned == {f"stockade-agent-{kept}"}
    finally:
        await second.close()


async def test_without_shared_state_every_other_replicas_pool_is_a_past_runs(
    kube: KubeMock, kubelet: Kubelet, tmp_path: Path, port: int
) -> None:
    first = _manager(kube, tmp_path, port, "inst0001aaaa-r1")
    await first.start()
    first.pool.start()
    (pooled,) = await _filled(first, 1)
    await _abandon(first)  # a killed supervisor leaves it behind
    assert kube.names("pod") == [pooled]
    restarted = _manager(kube, tmp_path, port, "inst0001aaaa-r9", pool=0)
    try:
        assert await restarted.start() == []  # an unclaimed pool pod is no one's to adopt
        assert await restarted.pool.reap() == 1
    finally:
        await restarted.close()
    assert kube.names("pod") == []
    assert kube.names("claim") == []


async def test_a_sweep_goes_on_when_the_shared_state_does_not_answer(
    kube: KubeMock, kubelet: Kubelet, tmp_path: Path, port: int, caplog: pytest.LogCaptureFixture
) -> None:
    """Without an answer about which replicas live, nothing is reaped (none is proven gone),
    and the rest of the sweep is done."""
    first = _manager(kube, tmp_path, port, "inst0001aaaa-r1")
    await first.start()
    first.pool.start()
    (pooled,) = await _filled(first, 1)
    await _abandon(first)
    second = _manager(kube, tmp_path, port, "inst0001aaaa-r2", pool=0)
    await second.start()

    async def down() -> frozenset[str]:
        raise StateUnavailable("the shared state (db) did not answer: connection refused")

    second.pool._replicas = down
    try:
        await second.sweep()
        assert kube.names("pod") == [pooled]
        assert "the pods of gone replicas not reaped: the shared state (db)" in caplog.text
    finally:
        await second.close()


@pytest.mark.parametrize("status", [409, 500])
async def test_a_failing_patch_costs_the_pool_pod_not_the_call(
    kube: KubeMock, kubelet: Kubelet, tmp_path: Path, port: int, status: int
) -> None:
    mgr = _manager(kube, tmp_path, port, "inst0001aaaa-r1")
    await mgr.start()
    mgr.pool.start()
    try:
        (pooled,) = await _filled(mgr, 1)
        answer: dict[str, Any] = {"kind": "Status", "code": status, "message": "no"}
        kube.react(lambda k: k[f"patch {PODS}/{pooled}"] << status << answer)
        assert await _exec(mgr, "k", "echo ok") == "ok\n"
        assert mgr.registry["k"].info.name == f"stockade-inst0001-{SID}"
        assert pooled not in kube.names("pod")  # dropped, with its claim and Secret
        ident = pooled.removeprefix("stockade-inst0001-")
        assert f"stockade-ws-{ident}" not in kube.names("claim")
        assert f"stockade-agent-{ident}" not in kube.names("secret")
        # the key's own claim, not the dropped pool pod's (relabeled before the pod's patch)
        assert _volumes(kube, f"stockade-inst0001-{SID}")[0] == f"stockade-ws-{SID}"
    finally:
        await mgr.close()


@pytest.mark.parametrize(
    "plain",
    [
        "é" * 128,  # the longest key there is (256 bytes), no valid label value
        'a/b\n"},{"op":"remove","path":"/metadata"}',  # JSON and JSON-patch in a key
        "io.stockade.replica=inst0001aaaa-r1",  # a key that looks like the maker's mark
    ],
)
async def test_a_hostile_key_claims_a_pool_pod_as_its_own_and_no_more(
    kube: KubeMock, kubelet: Kubelet, tmp_path: Path, port: int, plain: str
) -> None:
    """The key travels as an annotation where it cannot be a label, inside a merge patch's
    JSON; it is found again by another replica, and it never leaves the maker's mark."""
    key = scope("acme", plain)
    mgr = _manager(kube, tmp_path, port, "inst0001aaaa-r1")
    await mgr.start()
    mgr.pool.start()
    other = _manager(kube, tmp_path, port, "inst0001aaaa-r2", pool=0)
    await other.start()
    try:
        (pooled,) = await _filled(mgr, 1)
        before = kube.get("pod", pooled)
        assert before is not None
        assert await _exec(mgr, key, "echo ok") == "ok\n"
        assert mgr.registry[key].info.name == pooled
        found = kube.get("pod", pooled)
        assert found is not None
        labels = manifests.carried_labels(found["metadata"])
        assert (labels[LABEL_KEY], labels[LABEL_TENANT]) == (plain, "acme")
        assert labels[LABEL_SANDBOX_ID] == sandbox_id(key)
        assert LABEL_REPLICA not in labels
        assert found["spec"] == before["spec"]  # only its metadata changed
        assert (await other.get(key)).state.name == "RUNNING"  # by its label, elsewhere
        assert other.registry[key].info.name == pooled
    finally:
        await other.close()
        await mgr.close()


def test_relabeling_puts_each_label_where_kubernetes_holds_it() -> None:
    patch = manifests.relabeling(
        {LABEL_SANDBOX_ID: "ab12", LABEL_KEY: "a/b with spaces", LABEL_TENANT: None}
    )
    assert patch == {
        "metadata": {
            "labels": {LABEL_SANDBOX_ID: "ab12", LABEL_KEY: None, LABEL_TENANT: None},
            "annotations": {
                LABEL_SANDBOX_ID: None,
                LABEL_KEY: "a/b with spaces",
                LABEL_TENANT: None,
            },
        }
    }
