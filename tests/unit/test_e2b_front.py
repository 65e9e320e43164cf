"""The E2B front's parts that need no sandbox: records (persisted, tenant-scoped, expiry),
the list query (the SDK's double-encoded metadata, states, paging tokens), X-API-KEY to
tenant, the envd dispatch's access-token check, error bodies, and the [e2b] config checks.
Served for real, with the real SDK, in tests/integration/test_e2b_control.py."""

from __future__ import annotations

import json
import stat
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from stockade.supervisor.auth import Authenticator
from stockade.supervisor.config import AuthConfig, Config, load_config
from stockade.supervisor.errors import ConfigError, QuotaExceeded, SandboxNotFound
from stockade.supervisor.fronts.e2b import listing
from stockade.supervisor.fronts.e2b.control import Control
from stockade.supervisor.fronts.e2b.records import (
    PAUSED,
    RUNNING,
    E2bSandbox,
    Records,
    new_sandbox_id,
    rfc3339,
    valid_sandbox_id,
)
from stockade.supervisor.fronts.e2b.server import SANDBOX_STATE, Dispatch, build_app
from stockade.supervisor.fronts.e2b.wire import (
    ApiError,
    from_domain,
    seconds,
    string_map,
    tenant_of,
)
from stockade.supervisor.observe.refusals import TOOL, Refusals
from tests.unit.fakes import Audited, e2b_context


def sandbox(tenant: str = "acme", started: float = 1000.0, **kw: Any) -> E2bSandbox:
    sid = kw.pop("sandbox_id", new_sandbox_id())
    values: dict[str, Any] = {
        "sandbox_id": sid,
        "tenant": tenant,
        "key": f"{tenant}\0e2b-{sid}" if tenant else f"e2b-{sid}",
        "template_id": "base",
        "access_token": "tok-" + sid,
        "started_at": started,
        "end_at": started + 300,
    }
    values.update(kw)
    return E2bSandbox(**values)


def test_ids_look_like_e2bs() -> None:
    ids = {new_sandbox_id() for _ in range(200)}
    assert len(ids) == 200
    assert all(valid_sandbox_id(i) for i in ids)
    assert not valid_sandbox_id("ABCDEFGHIJKLMNOPQRST")
    assert not valid_sandbox_id("short")


def test_times_are_rfc3339_with_z() -> None:
    assert rfc3339(0) == "1970-01-01T00:00:00.000Z"
    assert rfc3339(1748779205.25) == "2025-06-01T12:00:05.250Z"


async def test_records_persist_privately_and_reload(tmp_path: Path) -> None:
    records = Records(tmp_path)
    one = sandbox(metadata={"a": "1"}, env_vars={"SECRET": "x"})
    await records.add(one)
    path = tmp_path / "e2b" / "sandboxes" / f"{one.sandbox_id}.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "e2b").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "e2b" / "sandboxes").stat().st_mode) == 0o700
    one.state = PAUSED
    one.end_at = 5000.0
    await records.save(one)
    again = Records(tmp_path)
    assert again.by_id(one.sandbox_id) == one
    assert again.get("acme", one.sandbox_id) is not None
    assert await again.remove(one.sandbox_id) == one
    assert Records(tmp_path).by_id(one.sandbox_id) is None


def test_unreadable_records_start_empty(tmp_path: Path) -> None:
    (tmp_path / "e2b").mkdir()
    (tmp_path / "e2b" / "sandboxes.json").write_text("{not json")
    assert len(Records(tmp_path)) == 0


async def test_lookups_are_scoped_to_the_tenant() -> None:
    records = Records(None)
    mine, theirs = sandbox("acme"), sandbox("other")
    await records.add(mine)
    await records.add(theirs)
    assert records.get("acme", mine.sandbox_id) is mine
    assert records.get("other", mine.sandbox_id) is None
    assert records.get("", mine.sandbox_id) is None
    assert records.of_tenant("acme") == [mine]
    assert records.by_id(theirs.sandbox_id) is theirs  # envd: the token decides


async def test_expired() -> None:
    records = Records(None)
    old, new = sandbox(end_at=100.0), sandbox(end_at=10_000.0)
    await records.add(old)
    await records.add(new)
    assert records.expired(now=500.0) == [old]
    assert records.expired(now=100.0) == [old]  # at its end it is gone
    assert sorted(s.sandbox_id for s in records.expired(now=20_000.0)) == sorted(
        [old.sandbox_id, new.sandbox_id]
    )


def sdk_metadata(metadata: dict[str, str]) -> str:
    """The metadata query value as the Python SDK builds it (paginator.py), then decoded
    once by the server's query parser, as Starlette does."""
    quoted = {urllib.parse.quote(k): urllib.parse.quote(v) for k, v in metadata.items()}
    wire = urllib.parse.urlencode({"metadata": urllib.parse.urlencode(quoted)})
    return urllib.parse.parse_qs(wire)["metadata"][0]


@pytest.mark.parametrize(
    "metadata",
    [{"a": "1"}, {"odd key": "a&b=c d%", "ü": "é/+?#"}, {"k": ""}, {"x=y": "1&2"}],
)
def test_the_sdks_metadata_filter_decodes(metadata: dict[str, str]) -> None:
    assert listing.parse_metadata(sdk_metadata(metadata)) == metadata


def test_js_style_metadata_decodes() -> None:
    # JS: encodeURIComponent of key and value, joined, then one query value
    inner = "&".join(
        f"{urllib.parse.quote(k, safe='')}={urllib.parse.quote(v, safe='')}"
        for k, v in {"a b": "c+d"}.items()
    )
    assert listing.parse_metadata(inner) == {"a b": "c+d"}


def test_states() -> None:
    assert listing.parse_states([]) == {RUNNING, PAUSED}
    assert listing.parse_states(["running"]) == {RUNNING}
    assert listing.parse_states(["running,paused"]) == {RUNNING, PAUSED}
    assert listing.parse_states(["paused", "running"]) == {RUNNING, PAUSED}
    with pytest.raises(ApiError) as bad:
        listing.parse_states(["killed"])
    assert bad.value.status == 400


def test_query_checks() -> None:
    query = listing.parse_query({})
    assert (query.limit, query.descending, query.after) == (100, True, None)
    for params in (
        {"limit": ["0"]},
        {"limit": ["101"]},
        {"limit": ["x"]},
        {"order": ["up"]},
        {"startedAfter": ["yesterday"]},
        {"nextToken": ["!!"]},
    ):
        with pytest.raises(ApiError) as bad:
            listing.parse_query(params)
        assert bad.value.status == 400
    moment = listing.parse_query({"startedAfter": ["2025-06-01T14:00:00+02:00"]})
    assert moment.started_after == 1748779200.0


@pytest.mark.parametrize("order", ["asc", "desc"])
@pytest.mark.parametrize("limit", [1, 2, 3, 7, 100])
def test_paging_visits_each_once_in_order(order: str, limit: int) -> None:
    found = [sandbox(started=float(i // 2)) for i in range(7)]  # ties in started_at
    seen: list[E2bSandbox] = []
    token = ""
    for _ in range(20):
        params = {"limit": [str(limit)], "order": [order]}
        if token:
            params["nextToken"] = [token]
        chosen, next_token = listing.page(found, listing.parse_query(params))
        assert len(chosen) <= limit
        seen += chosen
        if next_token is None:
            break
        token = next_token
    assert sorted(s.sandbox_id for s in seen) == sorted(s.sandbox_id for s in found)
    assert len(seen) == len(found)
    keys = [(s.started_at, s.sandbox_id) for s in seen]
    assert keys == sorted(keys, reverse=order == "desc")


def test_a_deleted_item_does_not_break_paging() -> None:
    found = [sandbox(started=float(i)) for i in range(4)]
    first, token = listing.page(found, listing.parse_query({"limit": ["2"], "order": ["asc"]}))
    assert token is not None
    rest = [s for s in found if s is not first[-1]]  # the cursor's own item went
    params = {"limit": ["2"], "order": ["asc"], "nextToken": [token]}
    second, _ = listing.page(rest, listing.parse_query(params))
    assert second == found[2:]


def test_filters() -> None:
    query = listing.parse_query(
        {"metadata": [sdk_metadata({"a": "1"})], "state": ["paused"], "template": ["base"]}
    )
    item = sandbox(metadata={"a": "1", "b": "2"})
    assert listing.matches(item, PAUSED, query)
    assert not listing.matches(item, RUNNING, query)
    assert not listing.matches(sandbox(metadata={"a": "2"}), PAUSED, query)
    assert not listing.matches(sandbox(metadata={"a": "1"}, template_id="x"), PAUSED, query)


def test_api_key_to_tenant(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("good-token-0123456789 acme\n")
    tokens.chmod(0o600)
    auth = Authenticator(AuthConfig(enabled=True, tokens_file=str(tokens)))
    assert tenant_of(auth, {"x-api-key": "good-token-0123456789"}) == "acme"
    spaced = "good-token-0123456789 x"
    for headers in ({}, {"x-api-key": ""}, {"x-api-key": "bad"}, {"x-api-key": spaced}):
        with pytest.raises(ApiError) as refused:
            tenant_of(auth, headers)
        assert refused.value.status == 401
    assert tenant_of(None, {}) == ""  # auth off: any key, no tenant
    assert tenant_of(None, {"x-api-key": "anything"}) == ""


def test_request_values() -> None:
    assert string_map(None, "m") == {}
    assert string_map({"a": "b"}, "m") == {"a": "b"}
    for bad in ({"a": 1}, ["a"], {"": "x"}, {"a\0": "x"}, "s"):
        with pytest.raises(ApiError):
            string_map(bad, "m")
    assert seconds(30, "timeout", 60) == 30
    assert seconds(0, "timeout", 60) == 0
    for bad_value in (61, -1, True, "30", float("nan"), None):
        with pytest.raises(ApiError):
            seconds(bad_value, "timeout", 60)


def test_domain_errors_answer_without_retries() -> None:
    assert from_domain(SandboxNotFound("x")).status == 404
    quota = from_domain(QuotaExceeded("full"))
    assert (quota.status, quota.headers) == (429, {"Should-Retry": "false"})


def test_config_checks(tmp_path: Path) -> None:
    cfg = load_config(None, {"e2b.listen": "127.0.0.1:0"})
    assert (cfg.e2b.default_timeout_s, cfg.e2b.max_timeout_s) == (300, 86400)
    assert load_config().e2b.listen == ""
    for overrides, message in (
        ({"e2b.listen": "0.0.0.0:3000"}, "loopback"),
        ({"e2b.listen": "10.1.2.3:3000"}, "loopback"),
        ({"e2b.default_timeout_s": 0}, "default_timeout_s"),
        ({"e2b.default_timeout_s": 100, "e2b.max_timeout_s": 50}, "default_timeout_s"),
        ({"e2b.sweep_interval_s": 0.0}, "sweep_interval_s"),
        ({"e2b.sweep_interval_s": float("nan")}, "sweep_interval_s"),
    ):
        with pytest.raises(ConfigError, match=message):
            load_config(None, overrides)


class Recorder:
    """An ASGI app that keeps the scope it was called with."""

    def __init__(self) -> None:
        self.scopes: list[dict[str, Any]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.scopes.append(scope)
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})


async def call(
    app: Any, headers: dict[str, str], method: str = "GET", path: str = "/health", query: str = ""
) -> tuple[int, dict[str, Any] | None]:
    scope = {
        "type": "http",
        "http_version": "1.1",
        "scheme": "http",
        "server": ("127.0.0.1", 3000),
        "client": ("127.0.0.1", 40000),
        "root_path": "",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "query_string": query.encode(),
        "state": {},
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    status = sent[0]["status"]
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return status, json.loads(body) if body else None


async def test_dispatch_checks_the_access_token(tmp_path: Path) -> None:
    records = Records(None)
    live = sandbox(started=time.time())
    ended = sandbox(end_at=time.time() - 1)
    await records.add(live)
    await records.add(ended)
    control, envd = Recorder(), Recorder()
    audit = Audited()
    ctx = e2b_context(Config(state_dir=tmp_path), records, refusals=Refusals(audit))
    app = Dispatch(ctx, control, envd, Control(ctx))
    sid = {"E2b-Sandbox-Id": live.sandbox_id}
    assert (await call(app, {}))[0] == 204  # no sandbox header: the control plane's
    assert len(control.scopes) == 1
    for token in (None, "", "tok-wrong", live.access_token + "x", ended.access_token):
        headers = dict(sid) if token is None else {**sid, "X-Access-Token": token}
        status, body = await call(app, headers)
        assert status == 401
        assert body is not None
        assert body["code"] == 401
    assert envd.scopes == []
    (refused,) = audit.records  # five refusals from one address: one record in its window
    assert (refused.tool, refused.front, refused.error_code) == (TOOL, "e2b", "UNAUTHENTICATED")
    assert "envd access token" in refused.policy_step
    assert live.access_token not in refused.arguments_json + refused.policy_step
    status, _ = await call(app, {**sid, "X-Access-Token": live.access_token})
    assert status == 204
    assert envd.scopes[0]["state"][SANDBOX_STATE] is live
    for unknown in ("nosuchsandbox0000000", ended.sandbox_id):
        status, body = await call(
            app, {"E2b-Sandbox-Id": unknown, "X-Access-Token": ended.access_token}
        )
        assert status == 502
        assert body is not None
        assert "was not found" in body["message"]
    assert len(envd.scopes) == 1


async def test_every_control_plane_answer_is_a_json_error_the_sdks_parse(tmp_path: Path) -> None:
    """Unknown paths, wrong methods and refused keys: {code: int, message: str}, as the
    SDKs require for every status; envd, absent from this build, answers 501."""
    records = Records(None)
    live = sandbox("other", started=time.time())
    await records.add(live)
    tokens = tmp_path / "tokens"
    tokens.write_text("good-token-0123456789 acme\n")
    tokens.chmod(0o600)
    audit = Audited()
    refusals = Refusals(audit)
    ctx = e2b_context(
        load_config(None, {"state_dir": str(tmp_path), "e2b.listen": "127.0.0.1:0"}),
        records,
        Authenticator(AuthConfig(enabled=True, tokens_file=str(tokens))),
        refusals,
    )
    app, _control = build_app(ctx)
    key = {"X-API-KEY": "good-token-0123456789"}
    for method, path, headers, status in (
        ("GET", "/nowhere", key, 404),
        ("PUT", "/v2/sandboxes", key, 405),
        ("GET", "/v2/sandboxes", {}, 401),
        ("GET", "/v2/sandboxes", {"X-API-KEY": "wrong"}, 401),
        ("GET", "/sandboxes/nosuchsandbox0000000", key, 404),
        ("DELETE", "/sandboxes/nosuchsandbox0000000", key, 404),
        ("POST", "/sandboxes/nosuchsandbox0000000/timeout", key, 404),
        ("GET", f"/sandboxes/{live.sandbox_id}", key, 404),  # another tenant's
        ("POST", f"/v2/sandboxes/{live.sandbox_id}/connect", key, 404),
    ):
        got, body = await call(app, headers, method, path)
        assert (method, path, got) == (method, path, status)
        assert body is not None
        assert body["code"] == status
        assert isinstance(body["message"], str)
    envd = {"E2b-Sandbox-Id": live.sandbox_id, "X-Access-Token": "not-the-token"}
    got, body = await call(app, envd, "POST", "/filesystem.Filesystem/Stat")
    assert got == 401  # the token is checked before envd sees the request
    refusals.close()  # the window's end: the refusals after its first record
    first, rest = audit.records  # three refusals from one address
    assert "missing X-API-KEY" in first.policy_step
    assert json.loads(first.arguments_json)["count"] == 1
    assert json.loads(rest.arguments_json)["count"] == 2
    assert {r.front for r in audit.records} == {"e2b"}
    assert not any("wrong" in r.arguments_json + r.policy_step for r in audit.records)
    assert body is not None
    assert body["code"] == 401
