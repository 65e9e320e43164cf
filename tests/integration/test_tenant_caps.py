"""The per-tenant caps (issue 26) attacked through a real `stockade serve` on both engines,
with its MCP and E2B fronts on and two token tenants (acme, the attacker; other): one tenant
past its cap of MCP sessions, E2B sandboxes, E2B metadata, open streams or watches gets a clear
refusal naming the setting (audited where the cap says so), while the other tenant's
sessions, sandboxes and commands are served meanwhile; room comes back once the attacker
ends one, and the supervisor's memory comes back after the flood. The caps' units:
tests/unit/test_tenant_caps.py."""

from __future__ import annotations

import concurrent.futures
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from e2b import Sandbox
from e2b.exceptions import RateLimitException, SandboxException

from stockade.client import ResourceExhausted, Started, Stockade, StreamEvent, ToolResult
from tests.integration.e2b_kit import E2bServed, serving_e2b
from tests.integration.harness import free_tcp_address
from tests.unit.test_tenant_caps import INIT, mcp_headers

pytestmark = pytest.mark.timeout(600)
SESSIONS, SANDBOXES, METADATA, STREAMS, WATCHES = 5, 2, 1000, 2, 2
"""The caps of the supervisor under test: mcp.max_sessions_per_tenant,
e2b.max_sandboxes_per_tenant, e2b.max_metadata_bytes, limits.max_streams_per_tenant,
limits.max_watches_per_tenant."""
FLOOD = 2000
"""initialize requests the attacker sends past its cap, all at once with its first ones
(before the cap: ~10,000 sessions in 30 s, +320 MB, every other tenant's initialize 503 for
30 minutes)."""
MiB = 1024 * 1024


@dataclass
class Fronts:
    e2b: E2bServed
    mcp: str
    """The MCP endpoint's URL."""


@pytest.fixture(scope="module")
def fronts(engine: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fronts]:
    mcp = free_tcp_address()
    caps = (
        f"max_sandboxes_per_tenant = {SANDBOXES}\nmax_metadata_bytes = {METADATA}\n",
        f'[mcp]\nlisten = "{mcp}"\nmax_sessions_per_tenant = {SESSIONS}\n'
        f"[limits]\nmax_streams_per_tenant = {STREAMS}\nmax_watches_per_tenant = {WATCHES}\n",
    )
    with serving_e2b(engine, tmp_path_factory.mktemp("caps"), e2b=caps[0], extra=caps[1]) as e2b:
        yield Fronts(e2b, f"http://{mcp}/mcp")


def echo_ok(served: E2bServed, token: str) -> None:
    """A sandbox of the token's tenant made with the e2b SDK, a command run in it, killed."""
    sandbox = Sandbox.create(**served.opts(token))
    try:
        assert sandbox.commands.run("echo ok").stdout == "ok\n"
    finally:
        assert sandbox.kill()


def test_mcp_sessions_past_the_cap(fronts: Fronts) -> None:
    served = fronts.e2b
    attacker, other = served.token, served.other
    before = served.sup.rss_bytes()
    with httpx.Client(timeout=60) as http:

        def initialize(token: str) -> httpx.Response:
            return http.post(fronts.mcp, json=INIT, headers=mcp_headers(token))

        def delete(token: str, answer: httpx.Response) -> None:
            session = answer.headers["mcp-session-id"]
            gone = http.delete(fronts.mcp, headers=mcp_headers(token, session))
            assert gone.status_code == 200

        with concurrent.futures.ThreadPoolExecutor(8) as pool:  # all at once, while B works
            flood = [pool.submit(initialize, attacker) for _ in range(SESSIONS + FLOOD)]
            theirs = initialize(other)
            assert theirs.status_code == 200
            assert theirs.json()["result"]["serverInfo"]["name"] == "stockade"
            echo_ok(served, other)
            answers = [f.result() for f in flood]
        opened = [r for r in answers if r.status_code == 200]
        refused = [r for r in answers if r.status_code != 200]
        assert (len(opened), {r.status_code for r in refused}) == (SESSIONS, {429})
        message = refused[-1].json()["error"]["message"]
        assert f"'acme' has {SESSIONS} open" in message
        assert "mcp.max_sessions_per_tenant" in message
        assert refused[-1].headers["retry-after"] == "60"
        for answer in opened:
            delete(attacker, answer)
        again = initialize(attacker)  # room again
        assert again.status_code == 200
        delete(attacker, again)
        delete(other, theirs)
    grown = served.sup.rss_bytes() - before
    assert grown < 50 * MiB, f"the supervisor grew {grown / MiB:.1f} MiB"


def attempt(served: E2bServed) -> Sandbox | RateLimitException:
    """A sandbox of the attacker's, or the SDK's refusal for 429."""
    try:
        return Sandbox.create(**served.opts())
    except RateLimitException as exc:
        return exc


def test_e2b_sandboxes_past_the_cap(fronts: Fronts) -> None:
    served = fronts.e2b
    with concurrent.futures.ThreadPoolExecutor(4) as pool:  # all at once
        tried = list(pool.map(lambda _: attempt(served), range(SANDBOXES + 2)))
    made = [s for s in tried if isinstance(s, Sandbox)]
    try:
        refused = [str(e) for e in tried if isinstance(e, RateLimitException)]
        assert (len(made), len(refused)) == (SANDBOXES, 2)
        assert all("e2b.max_sandboxes_per_tenant" in e for e in refused)
        echo_ok(served, served.other)  # meanwhile
        assert made.pop().kill()
        made.append(Sandbox.create(**served.opts()))  # room again
    finally:
        for sandbox in made:
            sandbox.kill()
    with served.sup.client(token=served.token) as client:
        failed = client.list_audit(tool="create_sandbox", errors_only=True, limit=50)
    refusals = [r for r in failed if "e2b.max_sandboxes_per_tenant" in r.policy_step]
    assert [(r.front, r.tenant) for r in refusals] == [("e2b", "acme")] * 2


@pytest.mark.parametrize(
    "options",
    [{"metadata": {"big": "x" * METADATA}}, {"envs": {f"K{i}": "é" * 10 for i in range(50)}}],
    ids=["metadata", "envs"],
)
def test_e2b_metadata_past_its_size(fronts: Fronts, options: dict[str, Any]) -> None:
    served = fronts.e2b
    with pytest.raises(SandboxException, match=r"^400: .*e2b\.max_metadata_bytes") as refused:
        Sandbox.create(**options, **served.opts())
    assert "more than this server keeps" in str(refused.value)
    assert Sandbox.list(**served.opts()).next_items() == []  # nothing made


HOLD = "while [ ! -e /tmp/go ]; do sleep 0.05; done; echo held"
"""A command that runs until the test lets it end (touching /tmp/go)."""


def started(stream: Iterator[StreamEvent]) -> None:
    """Follow a streamed call until its command has started (it holds its stream then)."""
    for event in stream:
        assert not isinstance(event, ToolResult), event
        if isinstance(event, Started):
            return
    raise AssertionError("the stream ended before its command started")


@dataclass
class Tenant:
    """A tenant's E2B sandbox, its sandbox key, and a gRPC client of the tenant."""

    sandbox: Sandbox
    key: str
    client: Stockade


@contextlib.contextmanager
def two_tenants(served: E2bServed) -> Iterator[tuple[Tenant, Tenant]]:
    """The attacker's and the other tenant's, each with an E2B sandbox (killed after)."""
    made: list[Sandbox] = []
    try:
        with contextlib.ExitStack() as stack:
            tenants = []
            for token in (served.token, served.other):
                made.append(Sandbox.create(**served.opts(token)))
                client = stack.enter_context(served.sup.client(token=token))
                tenants.append(Tenant(made[-1], f"e2b-{made[-1].sandbox_id}", client))
            yield tenants[0], tenants[1]
    finally:
        for sandbox in made:
            assert sandbox.kill()


def test_streams_past_the_cap(fronts: Fronts) -> None:
    with two_tenants(fronts.e2b) as (mine, theirs):
        attacker, key = mine.client, mine.key
        held = [attacker.call_stream(key, "exec", {"command": HOLD}) for _ in range(STREAMS)]
        for stream in held:
            started(stream)
        [refused] = list(attacker.call_stream(key, "exec", {"command": "echo no"}))
        assert isinstance(refused, ToolResult)
        assert refused.error_code == "RATE_LIMITED"
        assert f"limits.max_streams_per_tenant = {STREAMS}" in refused.error_message
        with pytest.raises(RateLimitException, match=r"limits\.max_streams_per_tenant"):
            mine.sandbox.commands.run("echo no")  # every front together: E2B's processes too
        *_, theirs_done = theirs.client.call_stream(theirs.key, "exec", {"command": "echo ok"})
        assert isinstance(theirs_done, ToolResult)
        assert theirs_done.stdout == "ok\n"
        assert theirs.sandbox.commands.run("echo ok").stdout == "ok\n"
        assert attacker.sandbox(key).exec("touch /tmp/go").exit_code == 0  # a unary call
        for stream in held:
            *_, done = stream
            assert isinstance(done, ToolResult)
            assert done.stdout == "held\n"
        assert mine.sandbox.commands.run("echo again").stdout == "again\n"  # room again
        records = attacker.list_audit(sandbox_key=key, errors_only=True, limit=50)
    steps = [r.policy_step for r in records]
    assert steps.count("limits.max_streams_per_tenant") == 2  # the gRPC one, the E2B one


def test_watches_past_the_cap(fronts: Fronts) -> None:
    with two_tenants(fronts.e2b) as (mine, theirs):
        held = [mine.client.watch_files(mine.key, ".") for _ in range(WATCHES)]  # in place
        try:
            with pytest.raises(ResourceExhausted, match=r"max_watches_per_tenant = 2"):
                mine.client.watch_files(mine.key, ".")
            with pytest.raises(RateLimitException, match=r"max_watches_per_tenant = 2"):
                mine.sandbox.files.watch_dir("/home/user")  # every front: E2B's watchers too
            theirs.client.watch_files(theirs.key, ".").close()  # meanwhile, in place
            theirs.sandbox.files.watch_dir("/home/user").stop()
        finally:
            for watch in held:
                watch.close()
        records = mine.client.list_audit(sandbox_key=mine.key, errors_only=True, limit=50)
    refused = [r for r in records if r.policy_step == "limits.max_watches_per_tenant"]
    assert sorted((r.front, r.error_code) for r in refused) == [
        ("e2b", "QUOTA_EXCEEDED"),
        ("grpc", "QUOTA_EXCEEDED"),
    ]
