"""Through a real `stockade serve` (both engines): each lifecycle change through gRPC is
exactly one audit record naming the front and the caller (calls/lifecycle.py); a flood of
refused authentication on the gRPC and MCP doors writes a bounded number of records, none
holding the token (observe/refusals.py); and a key with a CR is itself in List (key files
are bytes)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from stockade.client import StockadeError
from stockade.supervisor.observe.refusals import TOOL
from tests.integration.harness import Supervisor, refused_rows, serving_front

FLOOD = 1000


@pytest.fixture(scope="module")
def front(
    engine: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Supervisor, str, list[str]]]:
    with serving_front(engine, tmp_path_factory.mktemp("lifecycle"), "mcp") as served:
        yield served


def test_each_grpc_change_is_one_record_and_a_cr_key_is_itself(
    front: tuple[Supervisor, str, list[str]],
) -> None:
    sup, _address, tokens = front
    key = "line\rbreak"
    with sup.client(token=tokens[0]) as c:
        c.ensure_sandbox(key)
        assert c.pause_sandbox(key) is True
        assert c.resume_sandbox(key) is True
        assert c.destroy_sandbox(key) is True  # the workspace kept
        listed = [(s.key, s.state) for s in c.list_sandboxes()]
        assert listed == [(key, "ABSENT")]  # itself, no phantom "line\nbreak"
        records = c.list_audit(sandbox_key=key, limit=100)
    changes = [(r.tool, r.front, r.tenant) for r in reversed(records)]
    assert changes == [
        ("ensure_sandbox", "grpc", "acme"),
        ("pause_sandbox", "grpc", "acme"),
        ("resume_sandbox", "grpc", "acme"),
        ("destroy_sandbox", "grpc", "acme"),
    ]  # one each: no housekeeping record of the same change
    assert all(r.caller.startswith(("ipv4:", "ipv6:", "unix:")) for r in records)


def test_a_flood_of_refused_grpc_calls_is_bounded(
    front: tuple[Supervisor, str, list[str]],
) -> None:
    sup, _address, tokens = front
    wrong = "not-a-token-" + tokens[0][:8]
    with sup.client(token=wrong) as c:
        for _ in range(FLOOD):
            with pytest.raises(StockadeError):
                c.list_sandboxes()
    with sup.client(token=tokens[0]) as c:
        c.list_audit(limit=1)  # the audit log written up to now
    rows = refused_rows(sup, TOOL, "grpc")
    assert 1 <= len(rows) <= 2, rows  # the first at once; the rest when the window ends
    assert "invalid bearer token" in rows[0][1]
    assert json.loads(rows[0][2])["count"] == 1
    assert not any(wrong in "".join(row) for row in rows)


def test_a_flood_of_refused_mcp_requests_is_bounded(
    front: tuple[Supervisor, str, list[str]],
) -> None:
    sup, address, tokens = front
    with httpx.Client(base_url=f"http://{address}") as http:
        backed_off = 0
        for n in range(FLOOD):
            headers = {"authorization": "Bearer wrong-token"} if n % 2 else {}
            answer = http.post("/mcp", json={}, headers=headers)
            # 401; or, for a request with credentials once its address failed five times,
            # 429 while the listener's back-off lasts (fronts/backoff.py): its token unread
            assert answer.status_code in ((401, 429) if headers else (401,)), (n, answer)
            backed_off += answer.status_code == 429
        assert backed_off > 0
    with sup.client(token=tokens[0]) as c:
        c.list_audit(limit=1)
    rows = refused_rows(sup, TOOL, "mcp")
    assert 1 <= len(rows) <= 2, rows
    assert rows[0][0] in ("127.0.0.1", "::1")
    assert not any("wrong-token" in "".join(row) for row in rows)
