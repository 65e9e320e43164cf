"""AuditService.ReplayPolicy through the real gRPC server on an in-memory engine: an
operator's candidate config replayed over the calls the server recorded (its own tenant's
by default, every tenant's when asked); a tenant that is no operator is refused, and so
are an oversized or broken candidate."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from stockade.client import AsyncStockade
from stockade.supervisor.app import build_policy
from stockade.supervisor.auth import Authenticator
from stockade.supervisor.fronts.grpc.server import Server
from stockade.v1 import audit_pb2, audit_pb2_grpc
from tests.unit.fakes import FakeBackend, fake_manager, served_config

OPERATOR, TENANT = "o" * 32, "t" * 32
STRICTER = '[[guard.rules]]\nname = "no-push"\npattern = "git push"\n'


@pytest.fixture
async def target(tmp_path: Path) -> AsyncIterator[str]:
    tokens = f"{OPERATOR} ops\n{TENANT} acme\n"
    config = served_config(tmp_path, tokens, **{"console.operators": ["ops"]})
    manager = fake_manager(config, FakeBackend())
    await manager.start()
    server = Server(config, manager, build_policy(config), Authenticator(config.auth))
    await server.start()
    address = f"127.0.0.1:{server.port}"
    try:
        for token in (OPERATOR, TENANT):
            async with AsyncStockade(address, token=token) as client:
                for command in ("ls", "git push origin main", "git status"):
                    assert not (await client.call("box", "exec", {"command": command})).is_error
        yield address
    finally:
        await server.stop(0)


async def replay(address: str, token: str, **fields: object) -> audit_pb2.ReplayPolicyResponse:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = audit_pb2_grpc.AuditServiceStub(channel)
        request = audit_pb2.ReplayPolicyRequest(**fields)  # type: ignore[arg-type]
        reply: audit_pb2.ReplayPolicyResponse = await stub.ReplayPolicy(
            request, metadata=(("authorization", f"Bearer {token}"),)
        )
        return reply


async def test_an_operator_replays_its_tenants_calls(target: str) -> None:
    reply = await replay(target, OPERATOR, candidate_toml=STRICTER)
    assert (reply.replayed, reply.unchanged, reply.truncated) == (3, 2, False)
    [change] = reply.changes
    assert (change.was, change.now, change.rule, change.count) == (
        "allowed", "refused", "guard.no-push", 1,
    )  # fmt: skip
    [example] = change.examples
    assert (example.tenant, example.sandbox_key, example.tool) == ("ops", "box", "exec")
    assert "git push" in example.arguments_json


async def test_every_tenant_or_another_one_when_asked(target: str) -> None:
    every = await replay(target, OPERATOR, candidate_toml=STRICTER, all_tenants=True)
    assert (every.replayed, every.changes[0].count) == (6, 2)
    acme = await replay(target, OPERATOR, candidate_toml=STRICTER, tenant="acme")
    assert {e.tenant for c in acme.changes for e in c.examples} == {"acme"}
    first = await replay(target, OPERATOR, candidate_toml=STRICTER, max_records=2)
    assert (first.replayed, first.truncated) == (2, True)


async def test_a_tenant_that_is_no_operator_is_refused(target: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await replay(target, TENANT, candidate_toml=STRICTER)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "operators" in (refused.value.details() or "")


@pytest.mark.parametrize(
    ("candidate", "said"),
    [
        ("x" * ((1 << 20) + 1), "over 1 MiB"),
        ("[guard\nrules = 1", "cannot read the candidate config"),
        ('[[guard.rules]]\nname = "bad"\npattern = "("\n', "bad"),
        ("[limits]\nburst = 'many'\n", "limits.burst"),
        ("x = " + "[" * 100_000 + "]" * 100_000, "nests too deeply"),
    ],
)
async def test_a_bad_candidate_is_invalid_argument(target: str, candidate: str, said: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await replay(target, OPERATOR, candidate_toml=candidate)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert said in (refused.value.details() or "")


async def test_list_audit_gives_each_records_link(target: str) -> None:
    """ListAudit's records carry the chain: each one's previous hash is the hash of the
    record before it (one tenant's records, every one of them here, newest first)."""
    async with AsyncStockade(target, token=TENANT) as client:
        records = list(reversed(await client.list_audit(limit=100)))
    ours = [r for r in records if r.tool == "exec"]
    assert len(ours) == 3
    assert all(len(r.hash) == 64 and len(r.prev_hash) == 64 for r in records)
    by_id = {r.id: r for r in records}
    linked = [r for r in records if r.id - 1 in by_id]
    assert linked
    assert all(r.prev_hash == by_id[r.id - 1].hash for r in linked)
