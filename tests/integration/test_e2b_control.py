"""The E2B front's control plane through the real `stockade serve` on both engines, driven by
the unmodified e2b SDK (sync and async): create with metadata and env vars, get_info, list
with a metadata filter and paging, set_timeout, kill, connect, pause and resume, API keys
mapped to tenants (a wrong or missing key refused, another tenant's sandbox unknown), a
sandbox whose timeout passes removed, the audit naming the front; and the envd dispatch's
access-token check."""

from __future__ import annotations

import json
import secrets
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from e2b import AsyncSandbox, Sandbox, SandboxQuery, SandboxState
from e2b.exceptions import AuthenticationException, NotFoundException, SandboxException

from stockade.client import StockadeError
from tests.integration.e2b_kit import E2bServed, rest, serving_e2b
from tests.integration.harness import free_tcp_address, running_supervisor

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def served(engine: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2bServed]:
    folder = tmp_path_factory.mktemp("e2b")
    with serving_e2b(engine, folder, e2b="sweep_interval_s = 0.5\n") as served:
        yield served


def key_of(sandbox_id: str) -> str:
    return f"e2b-{sandbox_id}"


def test_create_info_list_timeout_kill(served: E2bServed) -> None:
    tag = secrets.token_hex(4)
    sbx = Sandbox.create(
        metadata={"suite": "control", "tag": tag, "odd key": "a&b=c d%"},
        envs={"GREETING": "hello"},
        timeout=120,
        **served.opts(),
    )
    try:
        assert len(sbx.sandbox_id) == 20
        with served.sup.client(token=served.token) as client:  # the sandbox exists already
            held = client.get_sandbox(key_of(sbx.sandbox_id))
            assert held.state == "RUNNING"
        info = sbx.get_info()
        assert info.sandbox_id == sbx.sandbox_id
        assert info.template_id == "base"
        assert info.metadata == {"suite": "control", "tag": tag, "odd key": "a&b=c d%"}
        assert info.state == SandboxState.RUNNING
        assert 110 <= (info.end_at - info.started_at).total_seconds() <= 121
        # list: the metadata filter (values that need encoding too), and paging
        other = Sandbox.create(metadata={"suite": "control", "tag": tag}, **served.opts())
        try:
            query = SandboxQuery(metadata={"tag": tag, "odd key": "a&b=c d%"})
            found = Sandbox.list(query=query, **served.opts()).next_items()
            assert [s.sandbox_id for s in found] == [sbx.sandbox_id]
            paginator = Sandbox.list(
                query=SandboxQuery(metadata={"tag": tag}), limit=1, **served.opts()
            )
            pages = []
            while paginator.has_next:
                pages.append([s.sandbox_id for s in paginator.next_items()])
            assert sorted(p[0] for p in pages) == sorted([sbx.sandbox_id, other.sandbox_id])
            assert all(len(p) == 1 for p in pages)
        finally:
            assert other.kill()
        # set_timeout moves the end
        sbx.set_timeout(600)
        later = sbx.get_info()
        assert (
            590
            <= (later.end_at - later.started_at).total_seconds()
            - (time.time() - later.started_at.timestamp())
            <= 601
        )
        # metrics: one sample of now
        metrics = sbx.get_metrics()
        assert len(metrics) == 1
        assert metrics[0].mem_total > 0
        assert metrics[0].mem_used > 0  # from the container's cgroup
        assert metrics[0].mem_used <= metrics[0].mem_total
        # a range: the sample of now only when the range reaches into the sandbox's life
        born = later.started_at
        assert len(sbx.get_metrics(start=born, end=datetime.now(UTC))) == 1
        before = born - timedelta(hours=1)
        assert sbx.get_metrics(start=before, end=born - timedelta(minutes=30)) == []
        assert sbx.get_metrics(start=datetime.now(UTC) + timedelta(hours=1)) == []
        status, body = rest(served, "GET", f"/sandboxes/{sbx.sandbox_id}/metrics?start=soon")
        assert status == 400
        assert "unix seconds" in body["message"]
    finally:
        assert sbx.kill() is True
    assert Sandbox.kill(sbx.sandbox_id, **served.opts()) is False  # unknown now
    assert Sandbox.kill("nosuchsandbox0000000", **served.opts()) is False
    with pytest.raises(NotFoundException):
        Sandbox.get_info(sbx.sandbox_id, **served.opts())
    with (
        served.sup.client(token=served.token) as client,  # container and workspace gone
        pytest.raises(StockadeError),
    ):
        client.get_sandbox(key_of(sbx.sandbox_id))
    with served.sup.client(token=served.token) as client:
        records = [r for r in client.list_audit(limit=200) if r.front == "e2b"]
    mine = [r for r in records if sbx.sandbox_id in r.sandbox_key]
    assert {"create_sandbox", "set_timeout", "destroy_sandbox"} <= {r.tool for r in mine}
    (killed,) = [r for r in mine if r.tool == "destroy_sandbox"]
    assert json.loads(killed.arguments_json)["as"] == "kill"
    created = next(r for r in mine if r.tool == "create_sandbox")
    assert "hello" not in created.arguments_json  # env var names only
    assert "GREETING" in created.arguments_json


def test_connect_pause_resume(served: E2bServed) -> None:
    sbx = Sandbox.create(**served.opts())
    try:
        again = Sandbox.connect(sbx.sandbox_id, **served.opts())
        assert again.sandbox_id == sbx.sandbox_id
        assert sbx.pause() is True
        assert Sandbox.get_info(sbx.sandbox_id, **served.opts()).state == SandboxState.PAUSED
        with served.sup.client(token=served.token) as client:
            assert client.get_sandbox(key_of(sbx.sandbox_id)).state == "PAUSED"
        assert sbx.pause() is False  # paused already
        paused = Sandbox.list(
            query=SandboxQuery(state=[SandboxState.PAUSED]), **served.opts()
        ).next_items()
        assert sbx.sandbox_id in [s.sandbox_id for s in paused]
        Sandbox.connect(sbx.sandbox_id, timeout=200, **served.opts())  # resumes it
        info = Sandbox.get_info(sbx.sandbox_id, **served.opts())
        assert info.state == SandboxState.RUNNING
        with served.sup.client(token=served.token) as client:
            assert client.get_sandbox(key_of(sbx.sandbox_id)).state == "RUNNING"
    finally:
        sbx.kill()
    with pytest.raises(NotFoundException):
        Sandbox.connect(sbx.sandbox_id, **served.opts())
    frozen = Sandbox.create(**served.opts())  # a paused sandbox can be killed
    assert frozen.pause() is True
    assert frozen.kill() is True
    with served.sup.client(token=served.token) as client, pytest.raises(StockadeError):
        client.get_sandbox(key_of(frozen.sandbox_id))


async def test_async_sdk(served: E2bServed) -> None:
    tag = secrets.token_hex(4)
    sbx = await AsyncSandbox.create(metadata={"tag": tag}, envs={"A": "1"}, **served.opts())
    try:
        info = await sbx.get_info()
        assert info.metadata == {"tag": tag}
        paginator = AsyncSandbox.list(query=SandboxQuery(metadata={"tag": tag}), **served.opts())
        assert [s.sandbox_id for s in await paginator.next_items()] == [sbx.sandbox_id]
        await sbx.set_timeout(90)
        assert await sbx.pause() is True
        again = await AsyncSandbox.connect(sbx.sandbox_id, **served.opts())
        assert (await again.get_info()).state == SandboxState.RUNNING
    finally:
        assert await sbx.kill() is True
    assert await AsyncSandbox.kill(sbx.sandbox_id, **served.opts()) is False


def test_api_keys_and_tenants(served: E2bServed) -> None:
    with pytest.raises(AuthenticationException):
        Sandbox.create(**served.opts(token="not-a-token"))
    with pytest.raises(AuthenticationException):
        Sandbox.list(**served.opts(token="not-a-token")).next_items()
    # no key at all: the SDK refuses before sending, so ask over HTTP
    request = urllib.request.Request(served.url + "/v2/sandboxes", method="GET")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 401
    assert json.loads(refused.value.read())["code"] == 401
    sbx = Sandbox.create(**served.opts())
    try:
        theirs = served.opts(token=served.other)
        with pytest.raises(NotFoundException):
            Sandbox.get_info(sbx.sandbox_id, **theirs)
        assert Sandbox.kill(sbx.sandbox_id, **theirs) is False
        with pytest.raises(NotFoundException):
            Sandbox.connect(sbx.sandbox_id, **theirs)
        with pytest.raises(SandboxException):
            Sandbox.set_timeout(sbx.sandbox_id, 5, **theirs)
        assert sbx.sandbox_id not in [s.sandbox_id for s in Sandbox.list(**theirs).next_items()]
        assert sbx.get_info().state == SandboxState.RUNNING  # untouched
    finally:
        sbx.kill()


def test_unknown_template_and_options_refused(served: E2bServed) -> None:
    with served.sup.client(token=served.token) as client:
        before = {s.key for s in client.list_sandboxes()}
    with pytest.raises(SandboxException, match="template"):
        Sandbox.create(template="python-data-science", **served.opts())
    with pytest.raises(SandboxException, match="timeout"):
        Sandbox.create(timeout=10**7, **served.opts())
    with pytest.raises(SandboxException, match="denyOut"):  # a deny list: not Stockade's
        Sandbox.create(network={"deny_out": ["10.0.0.0/8"]}, **served.opts())
    with pytest.raises(SandboxException, match="egress"):  # an allowlist on mode none
        Sandbox.create(
            network={"deny_out": ["0.0.0.0/0"], "allow_out": ["example.com"]}, **served.opts()
        )
    with pytest.raises(SandboxException, match="allow_internet_access"):
        Sandbox.create(allow_internet_access=True, **served.opts())  # network mode "none"
    with served.sup.client(token=served.token) as client:  # nothing was made
        assert {s.key for s in client.list_sandboxes()} == before


def test_a_sandbox_whose_timeout_passes_is_gone(served: E2bServed) -> None:
    sbx = Sandbox.create(timeout=2, **served.opts())
    workspace = served.sup.workspace(f"acme\0{key_of(sbx.sandbox_id)}")
    assert workspace.is_dir()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            sbx.get_info()
        except NotFoundException:
            break
        time.sleep(0.3)
    else:
        pytest.fail("the sandbox outlived its timeout")
    with served.sup.client(token=served.token) as client:
        for _ in range(50):  # the sweeper removes the container after the record
            try:
                client.get_sandbox(key_of(sbx.sandbox_id))
            except StockadeError:
                break
            time.sleep(0.2)
        else:
            pytest.fail("the expired sandbox's container is still there")
        removed = [r for r in client.list_audit(limit=200) if r.tool == "destroy_sandbox"]
    expired = [r for r in removed if json.loads(r.arguments_json).get("as") == "expire"]
    assert any(sbx.sandbox_id in r.sandbox_key and r.front == "e2b" for r in expired)
    assert {r.caller for r in expired} == {"supervisor"}
    assert not workspace.exists()
    assert sbx.kill() is False


def envd_request(served: E2bServed, sandbox_id: str, token: str | None) -> int:
    headers = {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": "49983"}
    if token is not None:
        headers["X-Access-Token"] = token
    request = urllib.request.Request(served.url + "/health", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        body = json.loads(exc.read())
        code = int(exc.code)
    assert body["code"] == code  # JSON errors with the status as an integer code
    assert isinstance(body["message"], str)
    return code


def test_envd_requests_need_the_sandboxs_access_token(served: E2bServed) -> None:
    sbx = Sandbox.create(**served.opts())
    other = Sandbox.create(**served.opts(token=served.other))
    try:
        token = sbx._envd_access_token
        assert token
        assert envd_request(served, sbx.sandbox_id, None) == 401
        assert envd_request(served, sbx.sandbox_id, "wrong" + token) == 401
        other_token = other._envd_access_token
        assert other_token
        assert envd_request(served, sbx.sandbox_id, other_token) == 401
        assert envd_request(served, sbx.sandbox_id, token) not in (401, 404, 502)
        assert envd_request(served, "nosuchsandbox0000000", token) == 502
    finally:
        sbx.kill()
        other.kill()
    assert envd_request(served, sbx.sandbox_id, token) == 502  # killed: not found


def test_sandboxes_survive_a_restart_with_auth_off(engine: str) -> None:
    """Records persist in STATE_DIR/e2b; with auth off any API key is accepted (tenant "")."""
    address = free_tcp_address()
    with running_supervisor(engine, f'[e2b]\nlisten = "{address}"\n') as sup:
        opts = {"api_url": f"http://{address}", "sandbox_url": f"http://{address}"}
        sbx = Sandbox.create(metadata={"k": "v"}, api_key="anything at all", **opts)
        before = sbx.get_info()
        records = sup.state_dir / "e2b" / "sandboxes" / f"{sbx.sandbox_id}.json"
        assert oct(records.stat().st_mode & 0o777) == "0o600"
        sup.stop()
        sup.start()
        after = Sandbox.get_info(sbx.sandbox_id, api_key="another key", **opts)
        assert (after.metadata, after.end_at) == ({"k": "v"}, before.end_at)
        with sup.client() as client:
            assert client.get_sandbox(key_of(sbx.sandbox_id)).state == "RUNNING"
        assert Sandbox.kill(sbx.sandbox_id, api_key="x", **opts) is True
        assert not records.exists()
        assert list(records.parent.iterdir()) == []


def test_the_older_sdks_paths(served: E2bServed) -> None:
    status, created = rest(served, "POST", "/sandboxes", {"templateID": "base", "secure": True})
    assert status == 201
    sid = created["sandboxID"]
    try:
        assert created["envdVersion"]
        assert created["envdAccessToken"]
        status, listed = rest(served, "GET", "/sandboxes")
        assert status == 200
        assert sid in [s["sandboxID"] for s in listed]
        assert rest(served, "POST", f"/sandboxes/{sid}/resume", {})[0] == 409  # not paused
        assert rest(served, "POST", f"/sandboxes/{sid}/pause", {})[0] == 204
        status, paused = rest(served, "POST", f"/sandboxes/{sid}/pause", {})
        assert (status, paused["code"]) == (409, 409)  # the JS SDK reads the body's code
        status, resumed = rest(served, "POST", f"/sandboxes/{sid}/resume", {"timeout": 60})
        assert (status, resumed["sandboxID"]) == (201, sid)
        status, connected = rest(served, "POST", f"/sandboxes/{sid}/connect", {"timeout": 60})
        assert (status, connected["sandboxID"]) == (200, sid)  # running: 200
    finally:
        assert rest(served, "DELETE", f"/sandboxes/{sid}")[0] == 204
    status, gone = rest(served, "DELETE", f"/sandboxes/{sid}")
    assert (status, gone["code"]) == (404, 404)
