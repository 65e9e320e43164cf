"""The per-tenant caps (issue 26) attacked through a real `stockade serve` on both engines,
with its MCP and E2B fronts on and two token tenants (acme, the attacker; other): one tenant
past its cap of MCP sessions, E2B sandboxes, E2B metadata or open streams gets a clear
refusal naming the setting (audited where the cap says so), while the other tenant's
sessions, sandboxes and commands are served meanwhile; room comes back once the attacker
ends one, and the supervisor's memory comes back after the flood. The caps' units:
tests/unit/test_tenant_caps.py."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from e2b import Sandbox
from e2b.exceptions import RateLimitException, SandboxException

from stockade.client import Started, StreamEvent, ToolResult
from tests.integration.e2b_kit import E2bServed, serving_e2b
from tests.integration.harness import free_tcp_address
from tests.unit.test_tenant_caps import INIT, mcp_headers

pytestmark = pytest.mark.timeout(600)
SESSIONS, SANDBOXES, METADATA, STREAMS = 5, 2, 1000, 2
"""The caps of the supervisor under test: mcp.max_sessions_per_tenant,
e2b.max_sandboxes_per_tenant, e2b.max_metadata_bytes, limits.max_streams_per_tenant."""
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
        f"[limits]\nmax_streams_per_tenant = {STREAMS}\n",
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


def test_e2b_sandboxes_past_the_cap(fronts: Fronts) -> None:
    served = fronts.e2b
    made = [Sandbox.create(**served.opts()) for _ in range(SANDBOXES)]
    try:
        with pytest.raises(RateLimitException, match=r"e2b\.max_sandboxes_per_tenant"):
            Sandbox.create(**served.opts())
        echo_ok(served, served.other)  # meanwhile
        assert made.pop().kill()
        made.append(Sandbox.create(**served.opts()))  # room again
    finally:
        for sandbox in made:
            sandbox.kill()
    with served.sup.client(token=served.token) as client:
        failed = client.list_audit(tool="create_sandbox", errors_only=True, limit=50)
    refusals = [r for r in failed if "e2b.max_sandboxes_per_tenant" in r.policy_step]
    assert len(refusals) == 1
    assert (refusals[0].front, refusals[0].tenant) == ("e2b", "acme")


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


def test_streams_past_the_cap(fronts: Fronts) -> None:
    served = fronts.e2b
    mine, theirs = Sandbox.create(**served.opts()), Sandbox.create(**served.opts(served.other))
    key, their_key = f"e2b-{mine.sandbox_id}", f"e2b-{theirs.sandbox_id}"
    try:
        with (
            served.sup.client(token=served.token) as attacker,
            served.sup.client(token=served.other) as other,
        ):
            held = [attacker.call_stream(key, "exec", {"command": HOLD}) for _ in range(STREAMS)]
            for stream in held:
                started(stream)
            [refused] = list(attacker.call_stream(key, "exec", {"command": "echo no"}))
            assert isinstance(refused, ToolResult)
            assert refused.error_code == "RATE_LIMITED"
            assert f"limits.max_streams_per_tenant = {STREAMS}" in refused.error_message
            with pytest.raises(RateLimitException, match=r"limits\.max_streams_per_tenant"):
                mine.commands.run("echo no")  # every front together: E2B's processes too
            *_, theirs_done = other.call_stream(their_key, "exec", {"command": "echo ok"})
            assert isinstance(theirs_done, ToolResult)
            assert theirs_done.stdout == "ok\n"
            assert theirs.commands.run("echo ok").stdout == "ok\n"
            assert attacker.sandbox(key).exec("touch /tmp/go").exit_code == 0  # a unary call
            for stream in held:
                *_, done = stream
                assert isinstance(done, ToolResult)
                assert done.stdout == "held\n"
            assert mine.commands.run("echo again").stdout == "again\n"  # room again
            records = attacker.list_audit(sandbox_key=key, errors_only=True, limit=50)
        steps = [r.policy_step for r in records]
        assert steps.count("limits.max_streams_per_tenant") == 2  # the gRPC one, the E2B one
    finally:
        assert mine.kill()
        assert theirs.kill()
