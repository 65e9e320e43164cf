"""A tenant cannot take another's share of the supervisor (docs/security.md#fair-share): one
that keeps being refused is slowed per credentials (fronts/backoff.py), and its transfers are
paced while another tenant calls (policy/limits.py FairShare, calls/transfers.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from stockade.supervisor.app import build_policy
from stockade.supervisor.calls.transfers import FileTransfers, Transfer
from stockade.supervisor.config import HttpConfig, load_config
from stockade.supervisor.fronts import backoff as backoff_module
from stockade.supervisor.fronts.backoff import (
    REFUSAL_BASE_S,
    REFUSAL_WAITING,
    Backoff,
    Throttled,
    presents,
)
from stockade.supervisor.keys import scope
from stockade.supervisor.models import CallContext
from stockade.supervisor.policy.limits import SHARED_BURST_S, SHARED_WINDOW_S, FairShare
from stockade.supervisor.sandboxes.agent_link import AgentReply
from tests.unit.test_tenant_caps import INIT, headers, mcp_front

# ---- refused requests slow their credentials ----

pass_turn = asyncio.sleep
"""The real sleep (the fixture puts a recording one in asyncio's place)."""


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Front:
    """Throttled over an app that answers every request with `status`; the waits the
    back-off asked for are recorded instead of slept (or held until `release` is set)."""

    def __init__(self, status: int = 429, free: int = 3, max_s: float = 1.0) -> None:
        self.status = status
        self.clock = Clock()
        self.waits: list[float] = []
        self.release: asyncio.Event | None = None
        self.handled = 0
        refused = Backoff(free, max_s, self.clock, base_s=REFUSAL_BASE_S, forget_s=10.0)
        auth = Backoff(5, 300.0, self.clock)
        self.front = Throttled(self.app, auth, HttpConfig(), "t", presents(b"x-api-key"), refused)

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.handled += 1
        await send({"type": "http.response.start", "status": self.status, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        if self.release is not None:
            await self.release.wait()

    async def ask(self, key: bytes | None = b"k1") -> tuple[int, bytes]:
        """One request presenting `key` (None: no credentials): its status and body."""
        said: list[dict[str, Any]] = []
        hdrs = [] if key is None else [(b"x-api-key", key)]
        scope: dict[str, Any] = {
            "type": "http", "path": "/", "headers": hdrs, "client": ("127.0.0.1", 5000),
        }  # fmt: skip

        async def receive() -> Any:
            return {"type": "http.request"}

        async def send(message: Any) -> None:
            said.append(message)

        await self.front(scope, receive, send)
        return said[0]["status"], b"".join(m.get("body", b"") for m in said[1:])


@pytest.fixture
def front(monkeypatch: pytest.MonkeyPatch) -> Front:
    made = Front()
    monkeypatch.setattr(backoff_module.asyncio, "sleep", made.sleep)
    return made


async def test_refusals_past_the_free_count_make_each_request_wait_twice_as_long(
    front: Front,
) -> None:
    for _ in range(3):
        assert await front.ask() == (429, b"")
    assert front.waits == []  # the free ones
    for _ in range(8):
        await front.ask()
    assert front.waits == [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.0]
    assert front.handled == 11  # waited, then handled: a right request still gets its answer


async def test_another_tenants_credentials_and_requests_without_any_never_wait(
    front: Front,
) -> None:
    for _ in range(6):
        await front.ask(b"k1")
    waited = len(front.waits)
    await front.ask(b"k2")
    await front.ask(None)
    assert len(front.waits) == waited


@pytest.mark.parametrize("status", [200, 201, 204, 401, 403, 404, 409, 500, 502])
async def test_answers_that_are_not_a_tenants_refusal_do_not_count(
    status: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = Front(status, free=0)
    monkeypatch.setattr(backoff_module.asyncio, "sleep", made.sleep)
    for _ in range(4):  # (401 counts for the address's auth back-off instead, past 5)
        await made.ask()
    assert made.waits == []


@pytest.mark.parametrize("status", sorted(backoff_module.REFUSALS))
async def test_each_refusal_status_counts(status: int, monkeypatch: pytest.MonkeyPatch) -> None:
    made = Front(status, free=0)
    monkeypatch.setattr(backoff_module.asyncio, "sleep", made.sleep)
    await made.ask()
    await made.ask()
    assert made.waits == [0.01]  # free=0: after the first refusal


async def test_a_quiet_spell_starts_over(front: Front) -> None:
    for _ in range(6):
        await front.ask()
    assert front.waits
    front.clock.now += 10.0
    front.waits.clear()
    await front.ask()
    assert front.waits == []


async def test_past_the_waiting_cap_a_request_is_answered_429_at_once(front: Front) -> None:
    for _ in range(4):
        await front.ask()
    front.release = asyncio.Event()
    held = [asyncio.create_task(front.ask()) for _ in range(REFUSAL_WAITING)]
    while len(front.waits) < 1 + REFUSAL_WAITING:
        await pass_turn(0)
    handled = front.handled
    status, body = await front.ask()
    assert status == 429
    assert b"too many refused requests with these credentials" in body
    assert front.handled == handled  # never reached the app
    assert b"k1" not in body
    front.release.set()
    assert {(await t)[0] for t in held} == {429}
    assert front.handled == handled + REFUSAL_WAITING
    await front.ask()  # the count of waiting requests went back down
    assert front.handled == handled + REFUSAL_WAITING + 1


async def test_a_console_sign_in_presents_no_credentials_to_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from stockade.supervisor.fronts.console.server import _signs_in

    assert _signs_in({"method": "POST", "path": "/login"}) == b""
    assert _signs_in({"method": "GET", "path": "/login"}) is None


def test_presents_gives_the_values_of_the_credential_headers() -> None:
    given = presents(b"x-api-key", b"x-access-token")
    assert given({"headers": []}) is None
    one = given({"headers": [(b"x-api-key", b"a")]})
    other = given({"headers": [(b"x-access-token", b"a")]})
    assert one
    assert other
    assert one != other  # the same value in another header: another key


async def test_a_flood_of_mcp_sessions_past_the_cap_is_held_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the real MCP front: past refusal_free_count refused openings, the tenant's
    further requests wait (5 s here); with REFUSAL_WAITING of them waiting, the rest are
    answered 429 at once by the back-off (its own text); another tenant opens its session
    meanwhile."""
    monkeypatch.setattr(backoff_module, "REFUSAL_BASE_S", 5.0)
    http = HttpConfig(refusal_free_count=2, refusal_backoff_max_s=30.0)
    async with mcp_front(tmp_path, 1, http=http) as (url, _f, _e), httpx.AsyncClient() as c:
        statuses = [
            (await c.post(url, json=INIT, headers=headers("acme"))).status_code for _ in range(3)
        ]
        assert statuses == [200, 429, 429]  # the session, then the two free cap refusals
        burst = [
            asyncio.create_task(c.post(url, json=INIT, headers=headers("acme"), timeout=60))
            for _ in range(REFUSAL_WAITING + 4)
        ]
        done, _pending = await asyncio.wait(burst, timeout=4)
        quick = [t.result() for t in done]
        assert len(quick) == 4
        assert all(r.status_code == 429 for r in quick)
        assert all(b"too many refused requests" in r.content for r in quick)
        theirs = await c.post(url, json=INIT, headers=headers("bravo"))
        assert theirs.status_code == 200
        for task in burst:
            task.cancel()
        await asyncio.gather(*burst, return_exceptions=True)


# ---- transfers give way to other tenants' calls ----


def test_a_tenant_alone_is_never_paced() -> None:
    clock = Clock()
    share = FairShare(1 << 20, clock)
    for _ in range(100):
        assert share.wait_s(scope("acme", "box"), 1 << 20) == 0.0


def test_while_another_tenant_calls_a_transfer_moves_at_the_shared_rate() -> None:
    clock = Clock()
    share = FairShare(1 << 20, clock)
    share.busy(scope("bravo", "box"))
    waits = [share.wait_s(scope("acme", "box"), 1 << 19) for _ in range(4)]
    assert waits == pytest.approx([0.5 - SHARED_BURST_S, 1.0 - SHARED_BURST_S,
                                   1.5 - SHARED_BURST_S, 2.0 - SHARED_BURST_S])  # fmt: skip
    clock.now += 2.0  # the transfer slept its waits; bravo is quiet since
    assert share.wait_s(scope("acme", "box"), 1 << 19) == 0.0
    assert not share.contended("acme")


def test_the_same_tenants_other_calls_do_not_slow_it() -> None:
    clock = Clock()
    share = FairShare(1 << 20, clock)
    share.busy(scope("acme", "other"))
    share.busy("")  # the keys of a supervisor without auth are a tenant "" of their own
    assert share.wait_s(scope("acme", "box"), 1 << 20) > 0  # "" is another tenant
    clock.now += SHARED_WINDOW_S + 0.01
    share.busy(scope("acme", "other"))
    assert share.wait_s(scope("acme", "box"), 1 << 20) == 0.0


def test_zero_never_paces() -> None:
    share = FairShare(0)
    share.busy(scope("bravo", "box"))
    assert share.wait_s(scope("acme", "box"), 1 << 30) == 0.0


class Recorded(FairShare):
    def __init__(self) -> None:
        super().__init__(1)
        self.paced_sizes: list[tuple[str, int]] = []

    async def paced(self, scoped_key: str, size: int) -> None:
        self.paced_sizes.append((scoped_key, size))


class Lease:
    def __init__(self, download: list[bytes]) -> None:
        self._download = download
        self.uploaded: list[bytes] = []

    async def upload(
        self, path: str, tar: bool, mode: int, chunks: AsyncIterator[bytes], wide: bool, /
    ) -> AgentReply:
        self.uploaded = [chunk async for chunk in chunks]
        return AgentReply("", "", {"path": "f", "size": 15})

    async def download(
        self, path: str, tar: bool, wide: bool, /
    ) -> AsyncIterator[bytes | AgentReply]:
        for chunk in self._download:
            yield chunk
        yield AgentReply("", "", {"path": "f"})


class Boxes:
    def __init__(self, lease: Lease) -> None:
        self._lease = lease

    def lease(self, key: str, /) -> Any:
        @asynccontextmanager
        async def held() -> AsyncIterator[Lease]:
            yield self._lease

        return held()


def transfers(tmp_path: Path, share: FairShare, lease: Lease) -> FileTransfers:
    config = load_config(None, {"state_dir": str(tmp_path), "audit.enabled": False})
    policy = replace(build_policy(config), share=share)
    return FileTransfers(config, Boxes(lease), policy)


async def test_uploads_and_downloads_are_paced_piece_by_piece(tmp_path: Path) -> None:
    share = Recorded()
    lease = Lease([b"abc", b"de"])
    files = transfers(tmp_path, share, lease)
    key = scope("acme", "box")
    t = Transfer(key, "f", False, CallContext(), "caller")

    async def chunks() -> AsyncIterator[bytes]:
        for chunk in (b"x" * 10, b"y" * 5):
            yield chunk

    await files.upload(t, chunks())
    assert lease.uploaded == [b"x" * 10, b"y" * 5]
    got = [item async for item in files.download(t)]
    pieces = got[:-1]
    assert b"".join(p for p in pieces if isinstance(p, bytes)) == b"abcde"
    sizes = [len(p) for p in pieces if isinstance(p, bytes)]  # as the scrubber let them go
    assert share.paced_sizes == [(key, 10), (key, 5)] + [(key, n) for n in sizes]


def test_a_setting_below_zero_is_refused(tmp_path: Path) -> None:
    from stockade.supervisor.errors import ConfigError

    with pytest.raises(ConfigError, match=r"limits\.shared_transfer_mb_per_s"):
        load_config(None, {"state_dir": str(tmp_path), "limits.shared_transfer_mb_per_s": -1})
