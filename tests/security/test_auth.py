"""Authentication and tenants, attacked through the real `stockade serve`, the real client and
real containers on both engines: every RPC without credentials, with wrong ones and with
malformed ones; tenant B reaching for tenant A's sandboxes, files, approvals and audit
records; the tokens file changed under a running supervisor; mutual TLS; the per-tenant
limits; and a start on a public address without authentication."""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import trustme
from google.protobuf import message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc

from stockade.client import (
    TLS,
    ApprovalClosed,
    ApprovalRequest,
    AsyncStockade,
    CallContext,
    NotFound,
    ResourceExhausted,
    Stockade,
    StockadeError,
    Unauthenticated,
    Unavailable,
)
from stockade.v1 import approval_pb2, audit_pb2, file_pb2, sandbox_pb2, tool_pb2
from tests.integration.harness import Supervisor, an_approver_connected, running_supervisor

pytestmark = pytest.mark.timeout(600)
TENANTS = ("a", "b", "lim", "mem")
SERVICES = [
    s for m in (sandbox_pb2, tool_pb2, approval_pb2, audit_pb2, file_pb2)
    for s in m.DESCRIPTOR.services_by_name.values()
]  # fmt: skip
RPCS = [(s, m) for s in SERVICES for m in s.methods]
ASKER = CallContext(agent_id="asker")


def write_tokens(path: Path, entries: dict[str, str], mode: int = 0o600) -> None:
    """Replace the tokens file atomically (a new inode: the supervisor sees the change)."""
    fresh = path.with_suffix(".new")
    fresh.write_text("".join(f"{token} {tenant}\n" for token, tenant in entries.items()))
    fresh.chmod(mode)
    os.replace(fresh, path)


class Tenants:
    def __init__(self, sup: Supervisor, tokens: dict[str, str], tokens_file: Path) -> None:
        self.sup, self.tokens, self.tokens_file = sup, tokens, tokens_file

    def client(self, tenant: str) -> Stockade:
        return self.sup.client(token=self.tokens[tenant])


@pytest.fixture(scope="module")
def tenants(engine: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tenants]:
    tokens = {t: secrets.token_hex(20) for t in TENANTS}
    tokens_file = tmp_path_factory.mktemp("auth") / "tokens"
    write_tokens(tokens_file, {v: k for k, v in tokens.items()})
    config = (
        f'[auth]\ntokens_file = "{tokens_file}"\n'
        '[agents.asker]\napprovals = "always"\n[approvals]\ntimeout_s = 30.0\n'
        "[tenants.lim]\nmax_sandboxes = 1\n"
        "[tenants.mem]\nmax_memory_mb = 1000\n"  # two sandboxes of 512 MiB would be 1024
    )
    with running_supervisor(engine, auth_config=config) as sup:
        yield Tenants(sup, tokens, tokens_file)


def _request(method: Any, key: str) -> Any:
    """An otherwise empty request of the method's type that names `key` where it can."""
    cls = message_factory.GetMessageClass(method.input_type)
    msg = cls()
    for path in ("key", "sandbox_key", "header.sandbox_key", "start.sandbox_key"):
        *parents, leaf = path.split(".")
        node = msg
        for p in parents:
            if p not in node.DESCRIPTOR.fields_by_name:
                break
            node = getattr(node, p)
        else:
            if leaf in node.DESCRIPTOR.fields_by_name:
                setattr(node, leaf, key)
    return msg


def _raw_call(target: str, service: Any, method: Any, key: str, metadata: Any) -> grpc.StatusCode:
    """Call one RPC by name; the status it ends with (OK when it did not fail)."""
    name = f"/{service.full_name}/{method.name}"
    request = _request(method, key)
    out = message_factory.GetMessageClass(method.output_type)
    codec = {"request_serializer": type(request).SerializeToString,
             "response_deserializer": out.FromString}  # fmt: skip
    kinds = (method.client_streaming, method.server_streaming)
    with grpc.insecure_channel(target) as channel:
        try:
            if kinds == (False, False):
                channel.unary_unary(name, **codec)(request, metadata=metadata, timeout=20)
            elif kinds == (False, True):
                list(channel.unary_stream(name, **codec)(request, metadata=metadata, timeout=5))
            elif kinds == (True, False):
                channel.stream_unary(name, **codec)(iter([request]), metadata=metadata, timeout=20)
            else:
                stream = channel.stream_stream(name, **codec)
                list(stream(iter([request]), metadata=metadata, timeout=5))
        except grpc.RpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


def test_every_rpc_is_covered() -> None:
    names = {f"{s.name}.{m.name}" for s, m in RPCS}
    assert len(names) == len(RPCS) >= 15
    assert {"ToolService.Interact", "FileService.UploadFile", "AuditService.ListAudit"} <= names


BAD_CREDENTIALS = {
    "none": (),
    "wrong": (("authorization", "Bearer " + "f" * 40),),
    "basic": (("authorization", "Basic YTpi"),),
    "empty-bearer": (("authorization", "Bearer "),),
    "no-scheme": (("authorization", "f" * 40),),
    "huge": (("authorization", "Bearer " + "x" * 6000),),
    "hash-of-a-token": (("authorization", "Bearer sha256:" + "0" * 64),),
}


@pytest.mark.parametrize("rpc", RPCS, ids=[f"{s.name}.{m.name}" for s, m in RPCS])
def test_every_rpc_refuses_missing_and_wrong_credentials(tenants: Tenants, rpc: Any) -> None:
    service, method = rpc
    with tenants.client("a") as a:
        a.sandbox("owned").write_file("x.txt", "x")
    target = tenants.sup.target
    for label, metadata in BAD_CREDENTIALS.items():
        code = _raw_call(target, service, method, "owned", metadata)
        assert code == grpc.StatusCode.UNAUTHENTICATED, f"{label}: {code}"
    # A valid token together with a wrong one is still refused: every header must hold.
    both = (("authorization", f"Bearer {tenants.tokens['a']}"), BAD_CREDENTIALS["wrong"][0])
    assert _raw_call(target, service, method, "owned", both) == grpc.StatusCode.UNAUTHENTICATED
    # ...and the same call with the right token gets past authentication (the test can fail)
    good = (("authorization", f"Bearer {tenants.tokens['a']}"),)
    assert _raw_call(target, service, method, "owned", good) != grpc.StatusCode.UNAUTHENTICATED


def test_refused_calls_do_nothing(tenants: Tenants) -> None:
    with tenants.client("a") as a:
        a.ensure_sandbox("present")
    with grpc.insecure_channel(tenants.sup.target) as channel:
        stub = channel.unary_unary(
            "/stockade.v1.SandboxService/EnsureSandbox",
            request_serializer=sandbox_pb2.EnsureSandboxRequest.SerializeToString,
            response_deserializer=sandbox_pb2.SandboxInfo.FromString,
        )
        with pytest.raises(grpc.RpcError) as info:
            stub(sandbox_pb2.EnsureSandboxRequest(key="ghost"), metadata=BAD_CREDENTIALS["wrong"])
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "invalid bearer token" in str(info.value.details())
    assert "f" * 40 not in tenants.sup.log(), "a presented token must not be logged"
    for tenant in TENANTS:
        with tenants.client(tenant) as c:
            assert "ghost" not in [s.key for s in c.list_sandboxes()]
    key_files = sorted((tenants.sup.state_dir / "sandboxes").glob("*/key"))
    assert key_files, "the check below must look at something"
    assert not [f for f in key_files if f.read_bytes().endswith(b"ghost")]


def test_client_errors_name_the_problem(tenants: Tenants) -> None:
    with tenants.sup.client() as anonymous, pytest.raises(Unauthenticated, match="missing"):
        anonymous.list_sandboxes()
    with tenants.sup.client(token="w" * 40) as wrong, pytest.raises(Unauthenticated):
        wrong.sandbox("k").exec("true")


def test_health_and_reflection_stay_open(tenants: Tenants) -> None:
    with grpc.insecure_channel(tenants.sup.target) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_same_key_is_a_different_sandbox_per_tenant(tenants: Tenants) -> None:
    with tenants.client("a") as a, tenants.client("b") as b:
        box_a, box_b = a.sandbox("shared"), b.sandbox("shared")
        box_a.write_file("secret.txt", "belongs to a\n")
        assert box_a.exec("cat secret.txt").stdout == "belongs to a\n"
        # b's "shared" is b's own, fresh sandbox: a's file is not there
        seen = box_b.exec("cat secret.txt")
        assert "belongs to a" not in seen.stdout + seen.stderr
        assert seen.exit_code != 0
        with pytest.raises(StockadeError):
            box_b.read_file("secret.txt")
        box_b.write_file("secret.txt", "belongs to b\n")
        assert box_a.read_file("secret.txt") == "belongs to a\n"
        info_a, info_b = a.get_sandbox("shared"), b.get_sandbox("shared")
        assert info_a.key == info_b.key == "shared"
        assert info_a.container_id != info_b.container_id
        assert info_a.workspace_path != info_b.workspace_path
        # streamed calls and interactive sessions land in the caller's own sandbox too
        streamed = list(b.call_stream("shared", "exec", {"command": "cat secret.txt"}))
        assert "belongs to b" in str(streamed[-1].stdout)  # type: ignore[union-attr]
        with b.sandbox("shared").interact("cat secret.txt") as session:
            assert "belongs to b" in session.read_until("\n")
        with tenants.client("b") as again:
            again.download("shared", "secret.txt", str(tenants.tokens_file.parent / "got"))
        assert (tenants.tokens_file.parent / "got").read_text() == "belongs to b\n"


def test_another_tenants_key_is_not_found(tenants: Tenants) -> None:
    with tenants.client("a") as a, tenants.client("b") as b:
        a.sandbox("only-a").write_file("data.txt", "a's data\n")
        before = a.get_sandbox("only-a")
        with pytest.raises(NotFound) as got:
            b.get_sandbox("only-a")
        assert "only-a" in str(got.value)
        assert "a's" not in str(got.value)
        with pytest.raises(NotFound):
            b.inspect_isolation("only-a")
        with pytest.raises(NotFound):
            b.destroy_sandbox("only-a")
        with pytest.raises(NotFound):
            b.destroy_sandbox("only-a", delete_workspace=True)
        with pytest.raises(NotFound):
            b.pause_sandbox("only-a")
        assert a.pause_sandbox("only-a") is True
        with pytest.raises(NotFound):
            b.resume_sandbox("only-a")
        assert a.get_sandbox("only-a").state == "PAUSED", "b's resume reached nothing"
        assert a.resume_sandbox("only-a") is True
        with pytest.raises(NotFound):
            b.download("only-a", "data.txt", str(tenants.tokens_file.parent / "stolen"))
        assert not (tenants.tokens_file.parent / "stolen").exists()
        b.upload("only-a", "data.txt", _local(tenants, b"b's upload\n"))
        # a's sandbox is untouched: same container, running, its file as it was
        after = a.get_sandbox("only-a")
        assert (after.container_id, after.state) == (before.container_id, "RUNNING")
        assert a.sandbox("only-a").read_file("data.txt") == "a's data\n"
        assert a.inspect_isolation("only-a").to_dict()["key"] == "only-a"


def _local(tenants: Tenants, data: bytes) -> str:
    path = tenants.tokens_file.parent / f"upload-{secrets.token_hex(4)}"
    path.write_bytes(data)
    return str(path)


def test_listing_shows_only_own_sandboxes(tenants: Tenants) -> None:
    with tenants.client("a") as a, tenants.client("b") as b:
        a.ensure_sandbox("listed-a")
        b.ensure_sandbox("listed-b")
        keys_a = {s.key for s in a.list_sandboxes()}
        keys_b = {s.key for s in b.list_sandboxes()}
    assert "listed-a" in keys_a
    assert "listed-a" not in keys_b
    assert "listed-b" in keys_b
    assert "listed-b" not in keys_a
    assert all("\x00" not in k for k in keys_a | keys_b)


def test_audit_is_per_tenant(tenants: Tenants) -> None:
    marker = secrets.token_hex(6)
    with tenants.client("a") as a, tenants.client("b") as b:
        a.sandbox("audited").exec(f"echo {marker}")
        mine = a.list_audit(sandbox_key="audited", limit=1000)
        assert any(marker in r.arguments_json for r in mine)
        assert {r.tenant for r in mine} == {"a"}
        assert {r.sandbox_key for r in mine} == {"audited"}
        for query in ({}, {"sandbox_key": "audited"}, {"tool": "exec"}):
            theirs = b.list_audit(limit=10000, **query)  # type: ignore[arg-type]
            assert not any(marker in r.arguments_json for r in theirs), query
            assert {r.tenant for r in theirs} <= {"b"}


class Approver:
    """An approver of one tenant that records what it sees and answers nothing."""

    def __init__(self, client: Stockade) -> None:
        self.client = client
        self.events: list[ApprovalRequest | ApprovalClosed] = []
        self.stream = client.watch_approvals("watcher")
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        an_approver_connected(client, within=20)

    def _run(self) -> None:
        for event in self.stream:
            self.events.append(event)


def test_approvals_are_per_tenant(tenants: Tenants) -> None:
    with tenants.client("a") as a, tenants.client("b") as b, tenants.client("b") as b_watch:
        watcher_b = Approver(b_watch)
        # b's approver does not count for a: a has none, so a's command is denied at once
        result = a.call("appr", "exec", {"command": "echo hi"}, context=ASKER)
        assert (result.error_code, "no approver" in result.error_message) == (
            "APPROVAL_DENIED", True,
        )  # fmt: skip
        assert a.list_approvals().approvers == 0
        assert b.list_approvals().approvers == 1
        with tenants.client("a") as a_watch:
            Approver(a_watch)
            outcome: list[Any] = []
            caller = threading.Thread(
                target=lambda: outcome.append(
                    a.call("appr", "exec", {"command": "echo approved"}, context=ASKER)
                )
            )
            caller.start()
            deadline = time.monotonic() + 30
            while not a.list_approvals().pending:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            pending = a.list_approvals().pending[0]
            assert pending.sandbox_key == "appr"
            assert b.list_approvals().pending == []
            with pytest.raises(NotFound):
                b.resolve_approval(pending.id, "allow-always")
            assert [p.id for p in a.list_approvals().pending] == [pending.id]
            a.resolve_approval(pending.id, "allow-always")
            caller.join(30)
        assert outcome[0].stdout == "approved\n"
        # a's allow-always is a's: the same command from b still needs b's approver
        assert "echo approved" in a.list_approvals().always_allowed
        assert "echo approved" not in b.list_approvals().always_allowed
        seen_by_b = [e.id for e in watcher_b.events]
        assert pending.id not in seen_by_b
        b_watch.close()


def test_limits_per_tenant(tenants: Tenants) -> None:
    with tenants.client("lim") as lim, tenants.client("mem") as mem:
        lim.ensure_sandbox("one")
        with pytest.raises(ResourceExhausted, match="at most 1 sandbox"):
            lim.ensure_sandbox("two")
        with pytest.raises(ResourceExhausted):
            lim.call("two", "exec", {"command": "true"})
        with pytest.raises(ResourceExhausted):
            lim.upload("two", "f", _local(tenants, b"x"))
        lim.ensure_sandbox("one")  # its own sandbox again is fine
        assert [s.key for s in lim.list_sandboxes() if s.state == "RUNNING"] == ["one"]
        # other tenants are not limited by lim's count
        with tenants.client("a") as a:
            a.ensure_sandbox("two")
        lim.destroy_sandbox("one")
        assert lim.sandbox("two").exec("echo ok").stdout == "ok\n"
        mem.ensure_sandbox("m1")
        with pytest.raises(ResourceExhausted, match="1000 MiB"):
            mem.ensure_sandbox("m2")


def test_hot_reload_of_the_tokens_file(tenants: Tenants) -> None:
    tokens, path = tenants.tokens, tenants.tokens_file
    everyone = {v: k for k, v in tokens.items()}
    newcomer = secrets.token_hex(20)
    try:
        # remove b's token: refused on the next call, without a restart
        write_tokens(path, {t: n for t, n in everyone.items() if n != "b"})
        with tenants.client("b") as b, pytest.raises(Unauthenticated):
            b.list_sandboxes()
        with tenants.client("a") as a:
            a.list_sandboxes()
        # add one: accepted at once (as tenant a: it sees a's sandboxes)
        write_tokens(path, {**everyone, newcomer: "a"})
        with tenants.sup.client(token=newcomer) as c, tenants.client("b") as b:
            b.list_sandboxes()
            c.sandbox("reload").write_file("r.txt", "via the new token")
        with tenants.client("a") as a:
            assert a.sandbox("reload").read_file("r.txt") == "via the new token"
        # a file that does not parse leaves the previous tokens in force, and says so
        path.write_text(f"{newcomer} a\nthis line is wrong\n")
        with tenants.sup.client(token=newcomer) as c:
            c.list_sandboxes()
        assert "not reloaded" in tenants.sup.log()
        assert "line 2" in tenants.sup.log()
        # a file others may read is refused the same way
        write_tokens(path, {newcomer: "a"}, mode=0o644)
        with tenants.client("b") as b:
            b.list_sandboxes()
        assert "lets others read or write it" in tenants.sup.log()
        # a deleted file accepts no token
        path.unlink()
        with tenants.client("a") as a, pytest.raises(Unauthenticated):
            a.list_sandboxes()
    finally:
        write_tokens(path, everyone)
    with tenants.client("a") as a:
        a.list_sandboxes()
    with tenants.sup.client(token=newcomer) as c, pytest.raises(Unauthenticated):
        c.list_sandboxes()


def test_async_client_sends_its_token_on_every_kind_of_call(tenants: Tenants) -> None:
    target, token_a = tenants.sup.target, tenants.tokens["a"]
    local = tenants.tokens_file.parent / "async-down"

    async def main() -> None:
        async with AsyncStockade(target, token=token_a) as a:
            await a.upload("async", "up.txt", b"uploaded\n")  # stream -> unary
            events = [e async for e in a.call_stream("async", "exec", {"command": "cat up.txt"})]
            assert events[-1].stdout == "uploaded\n"  # type: ignore[union-attr]
            session = await a.sandbox("async").interact("cat")  # stream <-> stream
            async with session:
                await session.send("echoed\n")
                assert await session.read_until("\n") == "echoed\n"
                await session.eof()
                assert not (await session.wait()).is_error
            await a.download("async", "up.txt", str(local))  # unary -> stream
            assert "async" in [s.key for s in await a.list_sandboxes()]  # unary
        async with AsyncStockade(target, token="w" * 40) as wrong:
            with pytest.raises(Unauthenticated):
                await wrong.list_sandboxes()
            with pytest.raises(Unauthenticated):
                await wrong.upload("async", "x", b"x")
        async with AsyncStockade(target, token=tenants.tokens["b"]) as b:
            assert "async" not in [s.key for s in await b.list_sandboxes()]

    asyncio.run(main())
    assert local.read_text() == "uploaded\n"


def test_cli_takes_a_token(tenants: Tenants) -> None:
    cli = [sys.executable, "-m", "stockade.supervisor.cli"]
    server = ["--server", tenants.sup.target]
    env = {**os.environ, "STOCKADE_TOKEN": tenants.tokens["a"]}
    done = subprocess.run([*cli, "exec", *server, "clikey", "--", "echo", "hi"],
                          capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    assert (done.returncode, done.stdout) == (0, "hi\n"), done.stderr
    flag = subprocess.run([*cli, "ls", *server, "--token", tenants.tokens["b"]],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert flag.returncode == 0
    assert "clikey" not in flag.stdout
    env = {k: v for k, v in os.environ.items() if k != "STOCKADE_TOKEN"}
    none = subprocess.run([*cli, "ls", *server], capture_output=True, text=True, timeout=60,
                          env=env)  # fmt: skip
    assert none.returncode != 0
    assert "UNAUTHENTICATED" in none.stderr


# --- mutual TLS -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("pki")
    ca, other_ca = trustme.CA(), trustme.CA()
    server = ca.issue_cert("localhost")
    server.private_key_and_cert_chain_pem.write_to_path(str(root / "server.pem"))
    server.private_key_pem.write_to_path(str(root / "server.key"))
    server.cert_chain_pems[0].write_to_path(str(root / "server.crt"))
    ca.cert_pem.write_to_path(str(root / "ca.pem"))
    return {"root": root, "ca": ca, "other_ca": other_ca}


def _tls(pki: dict[str, Any], issuer: trustme.CA | None, *names: str) -> TLS:
    ca_pem = pki["ca"].cert_pem.bytes()
    if issuer is None:
        return TLS(ca=ca_pem, server_name="localhost")
    cert = issuer.issue_cert(*names)
    chain, key = cert.cert_chain_pems[0].bytes(), cert.private_key_pem.bytes()
    # the server listens on a unix socket: its certificate names localhost
    return TLS(ca=ca_pem, cert=chain, key=key, server_name="localhost")


def test_mutual_tls_maps_certificates_to_tenants(engine: str, pki: dict[str, Any]) -> None:
    root = pki["root"]
    tokens_file = root / "tokens"
    token_b = secrets.token_hex(20)
    write_tokens(tokens_file, {token_b: "b"})
    config = (
        f'[auth]\ntokens_file = "{tokens_file}"\n'
        f'tls_cert = "{root / "server.crt"}"\ntls_key = "{root / "server.key"}"\n'
        f'client_ca = "{root / "ca.pem"}"\n'
        '[auth.client_certs]\n"agent-a.example" = "a"\n"both.example" = "a"\n'
        '"also-b.example" = "b"\n'
    )
    cert_a = _tls(pki, pki["ca"], "agent-a.example")
    with running_supervisor(engine, auth_config=config, tls=cert_a) as sup:
        with sup.client() as a:
            a.sandbox("tls").write_file("t.txt", "over mTLS\n")
            assert a.sandbox("tls").read_file("t.txt") == "over mTLS\n"
        # an unmapped certificate of the right CA needs a token, which then decides
        unmapped = _tls(pki, pki["ca"], "stranger.example")
        with sup.client(tls=unmapped) as c, pytest.raises(Unauthenticated, match="no tenant"):
            c.list_sandboxes()
        with sup.client(tls=unmapped, token=token_b) as c:
            assert "tls" not in [s.key for s in c.list_sandboxes()]
        # a certificate naming two tenants, or a token that disagrees with it: refused
        two = _tls(pki, pki["ca"], "both.example", "also-b.example")
        with sup.client(tls=two) as c, pytest.raises(Unauthenticated, match="more than one"):
            c.list_sandboxes()
        with sup.client(tls=cert_a, token=token_b) as c, pytest.raises(Unauthenticated):
            c.list_sandboxes()
        # a certificate from another CA, or none, does not get through the handshake
        for tls in (_tls(pki, pki["other_ca"], "agent-a.example"), _tls(pki, None)):
            with sup.client(tls=tls) as c, pytest.raises(Unavailable):
                c.list_sandboxes()
        with Stockade(sup.target) as plain, pytest.raises(Unavailable):
            plain.list_sandboxes()
        # the command line, with the certificate files
        issued = pki["ca"].issue_cert("agent-a.example")
        issued.cert_chain_pems[0].write_to_path(str(root / "a.crt"))
        issued.private_key_pem.write_to_path(str(root / "a.key"))
        cli = [sys.executable, "-m", "stockade.supervisor.cli", "ls", "--server", sup.target]
        tls = ["--tls-ca", str(root / "ca.pem"), "--tls-server-name", "localhost"]
        mine = ["--tls-cert", str(root / "a.crt"), "--tls-key", str(root / "a.key")]
        done = subprocess.run([*cli, *tls, *mine], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert "tls" in done.stdout
        refused = subprocess.run([*cli, *tls], capture_output=True, text=True, timeout=60)
        assert refused.returncode != 0
        assert "UNAVAILABLE" in refused.stderr


# --- starting without authentication ----------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    ("listen", "auth", "message"),
    [
        ("0.0.0.0:{port}", "", "authentication is required"),
        ("0.0.0.0:{port}", "[auth]\nenabled = false\n", "allowed only on a unix socket"),
        ("[::]:{port}", "[auth]\nenabled = false\n", "allowed only on a unix socket"),
        ("127.0.0.1:{port}", "", "authentication is required"),
        ("127.0.0.1:{port}", "[auth]\nenabled = true\n", "authentication is required"),
    ],
)
def test_serve_refuses_to_start_without_auth(
    tmp_path: Path, listen: str, auth: str, message: str
) -> None:
    """Refused before anything binds or touches the engine (whose socket is nothing here)."""
    port = _free_port()
    config = tmp_path / "c.toml"
    state = tmp_path / "state"
    config.write_text(
        f'listen = "{listen.format(port=port)}"\nstate_dir = "{state}"\n'
        f'[engine]\nkind = "podman"\nsocket = "unix://{tmp_path}/nothing.sock"\n{auth}'
    )
    done = subprocess.run(
        [sys.executable, "-m", "stockade.supervisor.cli", "serve", "--config", str(config)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert "does not answer" not in done.stderr
    assert not state.exists(), "nothing may be set up before the refusal"


def test_no_auth_flag_serves_on_loopback_only(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "stockade.supervisor.cli", "serve", "--no-auth",
           "--listen", f"0.0.0.0:{_free_port()}", "--state-dir", str(tmp_path / "s")]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "allowed only on a unix socket" in done.stderr
