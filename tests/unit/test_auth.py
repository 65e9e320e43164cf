"""Authentication and tenant scoping without an engine: the listen decision, the tokens file
(hostile contents, hot reload, permissions), the authenticator, scoped keys, approvals, the
audit log and the database migration, config checks and the per-tenant limits."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import sqlite3
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stockade.supervisor.auth import (
    MAX_FILE_BYTES,
    Authenticator,
    TokenFile,
    auth_enabled,
    local_only,
)
from stockade.supervisor.config import (
    ApprovalsConfig,
    AuthConfig,
    Config,
    SandboxConfig,
    TenantConfig,
    load_config,
)
from stockade.supervisor.errors import (
    ApprovalNotFound,
    ConfigError,
    InvalidRequest,
    QuotaExceeded,
    Unauthenticated,
)
from stockade.supervisor.keys import MAX_KEY_BYTES, scope, shown, split, validate_scoped
from stockade.supervisor.observe.audit import AuditLog, AuditQuery, AuditRecord
from stockade.supervisor.policy.approvals import AllowAlways, ApprovalManager, Pending
from stockade.supervisor.sandboxes.manager import SandboxManager
from tests.unit.fakes import FakeBackend, fake_manager

TOKEN_A = "a" * 32
TOKEN_B = "b-token-0123456789abcdef"


@pytest.mark.parametrize(
    ("listen", "local"),
    [
        ("unix:/run/stockade.sock", True),
        ("unix:///run/stockade.sock", True),
        ("127.0.0.1:50051", True),
        ("127.8.9.10:1", True),
        ("[::1]:50051", True),
        ("localhost:50051", True),
        ("0.0.0.0:50051", False),
        ("[::]:50051", False),
        (":50051", False),
        ("10.0.0.5:50051", False),
        ("example.com:50051", False),
        ("[::ffff:127.0.0.1]:1", False),  # mapped: not what is_loopback says; stay strict
        ("127.0.0.1.example.com:1", False),
    ],
)
def test_local_only(listen: str, local: bool) -> None:
    assert local_only(listen) is local


def _config(listen: str, **auth: object) -> Config:
    return Config(listen=listen, auth=AuthConfig(**auth))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("listen", "auth", "outcome"),
    [
        ("127.0.0.1:1", {}, "required"),  # not configured: neither on nor explicitly off
        ("unix:/x", {}, "required"),
        ("127.0.0.1:1", {"enabled": True}, "required"),
        ("127.0.0.1:1", {"enabled": False}, False),
        ("unix:/x", {"enabled": False}, False),
        ("0.0.0.0:1", {"enabled": False}, "only on a unix socket"),
        ("10.1.2.3:1", {"enabled": False}, "only on a unix socket"),
        ("0.0.0.0:1", {}, "required"),
        ("0.0.0.0:1", {"tokens_file": "/t"}, True),
        ("unix:/x", {"tokens_file": "/t"}, True),
        ("0.0.0.0:1", {"tls_cert": "c", "tls_key": "k", "client_ca": "ca"}, True),
    ],
)
def test_auth_decision(listen: str, auth: dict[str, object], outcome: object) -> None:
    config = _config(listen, **auth)
    if isinstance(outcome, bool):
        assert auth_enabled(config) is outcome
    else:
        with pytest.raises(ConfigError, match=str(outcome)):
            auth_enabled(config)


@pytest.mark.parametrize(
    ("auth", "message"),
    [
        ({"tls_cert": "c"}, "go together"),
        ({"client_ca": "ca"}, "needs auth.tls_cert"),
        ({"client_certs": {"x": "a"}}, "needs auth.client_ca"),
        ({"enabled": False, "tokens_file": "/t"}, "enabled = false, yet"),
        (
            {"tls_cert": "c", "tls_key": "k", "client_ca": "ca", "client_certs": {"x": "a b"}},
            "tenant name",
        ),
    ],
)
def test_auth_config_errors(auth: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _config("unix:/x", **auth)


def test_tenant_config(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        "[auth]\nenabled = false\n[tenants.a]\nmax_sandboxes = 2\n"
        '[tenants."*"]\nmax_memory_mb = 9\n'
    )
    config = load_config(path)
    assert config.auth.enabled is False
    assert config.tenant_limits("a") == TenantConfig(max_sandboxes=2)
    assert config.tenant_limits("other") == TenantConfig(max_memory_mb=9)
    assert config.tenant_limits("") == TenantConfig()
    for bad, message in [
        ("[auth]\nenabled = 1\n", "must be bool"),
        ("[auth]\nmode = 'x'\n", "unknown key"),
        ("[tenants.a]\nmax_sandboxes = -1\n", "must not be negative"),
        ("[tenants.'a/b']\nmax_sandboxes = 1\n", "tenant name"),
    ]:
        path.write_text(bad)
        with pytest.raises(ConfigError, match=message):
            load_config(path)


def write(path: Path, text: str, mode: int = 0o600) -> None:
    fresh = path.with_suffix(".tmp")
    fresh.write_text(text)
    fresh.chmod(mode)
    os.replace(fresh, path)


@pytest.fixture
def tokens(tmp_path: Path) -> Path:
    path = tmp_path / "tokens"
    write(path, f"# comment\n\n{TOKEN_A} a\n  {TOKEN_B}\tb  \n")
    return path


def test_tokens_file_maps_tokens_to_tenants(tokens: Path) -> None:
    file = TokenFile(tokens)
    assert file.tenant_for(TOKEN_A) == "a"
    assert file.tenant_for(TOKEN_B) == "b"
    for wrong in ("", TOKEN_A[:-1], TOKEN_A + "a", TOKEN_A.upper(), "x" * 100_000, "\udcff"):
        assert file.tenant_for(wrong) is None


def test_hashed_tokens(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    digest = hashlib.sha256(TOKEN_A.encode()).hexdigest()
    write(path, f"sha256:{digest} a\n")
    file = TokenFile(path)
    assert file.tenant_for(TOKEN_A) == "a"
    assert file.tenant_for(f"sha256:{digest}") is None, "the digest is not a token"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("short a\n", "at least 16"),
        (f"{TOKEN_A}\n", "1 fields"),
        (f"{TOKEN_A} a extra\n", "3 fields"),
        (f"{TOKEN_A} ../etc\n", "tenant name"),
        (f"{TOKEN_A} {'t' * 65}\n", "tenant name"),
        (f"{TOKEN_A} a\n{TOKEN_A} b\n", "twice"),
        ("sha256:abc a\n", "64 hex"),
        (f"sha256:{'zz' * 32} a\n", "64 hex"),
        ("tökenwith-non-ascii-chars a\n", "printable ASCII"),
    ],
)
def test_bad_tokens_files_are_refused_at_start(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "tokens"
    write(path, text)
    with pytest.raises(ConfigError, match=message) as info:
        TokenFile(path)
    assert TOKEN_A not in str(info.value), "an error never quotes a token"


@pytest.mark.parametrize("mode", [0o644, 0o604, 0o620, 0o666, 0o602])
def test_tokens_file_others_may_read_or_write_is_refused(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "tokens"
    write(path, f"{TOKEN_A} a\n", mode)
    with pytest.raises(ConfigError, match="chmod 600"):
        TokenFile(path)


def test_tokens_file_group_read_is_allowed(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    write(path, f"{TOKEN_A} a\n", 0o640)
    assert TokenFile(path).tenant_for(TOKEN_A) == "a"


def test_huge_tokens_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    write(path, f"{TOKEN_A} a\n" * (MAX_FILE_BYTES // 34 + 1))
    with pytest.raises(ConfigError, match="larger than 16 MiB"):
        TokenFile(path)


def test_missing_or_binary_tokens_file_is_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="No such file"):
        TokenFile(tmp_path / "nothing")
    (tmp_path / "bin").write_bytes(b"\xff\xfe" * 10)
    (tmp_path / "bin").chmod(0o600)
    with pytest.raises(ConfigError):
        TokenFile(tmp_path / "bin")


def test_hot_reload(tokens: Path, caplog: pytest.LogCaptureFixture) -> None:
    file = TokenFile(tokens)
    write(tokens, f"{TOKEN_A} a\n")  # b removed
    assert file.tenant_for(TOKEN_B) is None
    write(tokens, f"{TOKEN_A} a\n{TOKEN_B} c\n")  # b back, as another tenant
    assert file.tenant_for(TOKEN_B) == "c"
    with caplog.at_level(logging.ERROR):
        write(tokens, f"{TOKEN_A} a\nbroken\n")
        assert file.tenant_for(TOKEN_B) == "c", "a broken file keeps the previous tokens"
        assert file.tenant_for(TOKEN_A) == "a"
        write(tokens, f"{TOKEN_A} a\n", 0o644)
        assert file.tenant_for(TOKEN_B) == "c", "a file others can read is not taken"
    assert "line 2" in caplog.text
    assert "chmod 600" in caplog.text
    assert TOKEN_A not in caplog.text
    # edited in place (same inode), also found
    tokens.chmod(0o600)
    with tokens.open("w") as f:
        f.write(f"{TOKEN_B} b\n")
    assert file.tenant_for(TOKEN_A) is None
    assert file.tenant_for(TOKEN_B) == "b"
    tokens.unlink()
    assert file.tenant_for(TOKEN_B) is None, "a deleted file accepts no token"
    write(tokens, f"{TOKEN_B} b\n")
    assert file.tenant_for(TOKEN_B) == "b"


def authenticator(tokens: Path | None, certs: dict[str, str] | None = None) -> Authenticator:
    return Authenticator(
        AuthConfig(tokens_file=str(tokens) if tokens else "", client_certs=certs or {})
    )


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ((), "missing credentials"),
        (("Basic YTpi",), "must be `Bearer TOKEN`"),
        (("Bearer",), "must be `Bearer TOKEN`"),
        (("Bearer    ",), "must be `Bearer TOKEN`"),
        (("Bearer " + "x" * 40,), "invalid bearer token"),
        (("Bearer " + "x" * 10_000,), "invalid bearer token"),
        ((f"Bearer {TOKEN_A}", f"Bearer {TOKEN_A}"), "more than one"),
        ((f"Bearer {TOKEN_A}", "Bearer x"), "more than one"),
        ((TOKEN_A,), "must be `Bearer TOKEN`"),
    ],
)
def test_authenticator_refuses(tokens: Path, headers: tuple[str, ...], message: str) -> None:
    with pytest.raises(Unauthenticated, match=message) as info:
        authenticator(tokens).authenticate(headers, ())
    assert TOKEN_A not in str(info.value)


def test_authenticator_accepts(tokens: Path) -> None:
    auth = authenticator(tokens)
    assert auth.authenticate([f"Bearer {TOKEN_A}"], ()) == "a"
    assert auth.authenticate([f"bearer  {TOKEN_B} "], ()) == "b"


def test_certificates(tokens: Path) -> None:
    auth = authenticator(tokens, {"agent.example": "a", "other.example": "b", "CN-a": "a"})
    assert auth.authenticate((), ["agent.example"]) == "a"
    assert auth.authenticate((), ["agent.example", "CN-a"]) == "a"
    assert auth.authenticate([f"Bearer {TOKEN_A}"], ["agent.example"]) == "a"
    assert auth.authenticate([f"Bearer {TOKEN_B}"], ["stranger"]) == "b"
    with pytest.raises(Unauthenticated, match="more than one tenant"):
        auth.authenticate((), ["agent.example", "other.example"])
    with pytest.raises(Unauthenticated, match="disagree"):
        auth.authenticate([f"Bearer {TOKEN_B}"], ["agent.example"])
    with pytest.raises(Unauthenticated, match="maps to no tenant"):
        auth.authenticate((), ["stranger"])
    with pytest.raises(Unauthenticated, match="invalid bearer token"):
        authenticator(None, {"x": "a"}).authenticate([f"Bearer {TOKEN_A}"], ["x"])


# --- scoped keys --------------------------------------------------------------------------

tenant_names = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,10}", fullmatch=True)
keys = st.text(min_size=1, max_size=40).filter(
    lambda k: "\x00" not in k and len(k.encode("utf-8", "surrogatepass")) <= MAX_KEY_BYTES
)
keys = keys.filter(lambda k: not any(0xD800 <= ord(c) <= 0xDFFF for c in k))


@given(tenant_names | st.just(""), keys, tenant_names | st.just(""), keys)
def test_scoped_keys_never_collide(t1: str, k1: str, t2: str, k2: str) -> None:
    a, b = scope(t1, k1), scope(t2, k2)
    assert (a == b) == ((t1, k1) == (t2, k2))
    assert split(a) == (t1, k1)
    assert shown(a) == k1
    assert validate_scoped(a) == a


def test_scope_refuses_a_key_that_names_a_tenant() -> None:
    for key in ("a\x00k", "\x00", "", "x" * 257):
        with pytest.raises(InvalidRequest):
            scope("", key)
        with pytest.raises(InvalidRequest):
            scope("b", key)
    with pytest.raises(InvalidRequest, match="tenant name"):
        validate_scoped("bad/tenant\x00k")


# --- approvals and audit per tenant -------------------------------------------------------


async def test_approvals_are_per_tenant(tmp_path: Path) -> None:
    mgr = ApprovalManager(ApprovalsConfig(mode="always"), {}, AllowAlways(tmp_path / "db"))
    seen_b: list[object] = []

    async def watch_b() -> None:
        async for event in mgr.watch("b"):
            seen_b.append(event)

    watcher_b = asyncio.create_task(watch_b())
    while mgr.watchers_of("b") == 0:
        await asyncio.sleep(0.001)
    # b's approver does not count for a
    outcome = await mgr.check(
        sandbox_key=scope("a", "k"), agent_id="", tool="exec", command="ls", request_id="r"
    )
    assert outcome.how == "no-approver"
    seen_a: list[Pending] = []

    async def watch_a() -> None:
        async for event in mgr.watch("a"):
            if isinstance(event, Pending):
                seen_a.append(event)

    watcher_a = asyncio.create_task(watch_a())
    while mgr.watchers_of("a") == 0:
        await asyncio.sleep(0.001)
    asking = asyncio.create_task(
        mgr.check(sandbox_key=scope("a", "k"), agent_id="", tool="exec", command="ls",
                  request_id="r")
    )  # fmt: skip
    while not seen_a:
        await asyncio.sleep(0.001)
    request = seen_a[0]
    assert mgr.pending("b") == []
    assert mgr.pending("") == []
    assert [p.id for p in mgr.pending("a")] == [request.id]
    for other in ("b", ""):
        with pytest.raises(ApprovalNotFound):
            mgr.resolve(request.id, "allow-always", "mallory", tenant=other)
    mgr.resolve(request.id, "allow-always", "alice", tenant="a")
    assert (await asking).allowed
    assert mgr.always_allowed("a") == ["ls"]
    assert mgr.always_allowed("b") == []
    assert "ls" not in mgr.always_allowed()
    assert mgr.reason_to_ask("", "ls", "b") is not None
    assert seen_b == [], "b saw nothing of a's request or its close"
    for task in (watcher_a, watcher_b):
        task.cancel()
    await asyncio.gather(watcher_a, watcher_b, return_exceptions=True)
    # persisted per tenant
    again = AllowAlways(tmp_path / "db")
    assert again.has("a", "ls")
    assert not again.has("b", "ls")
    assert "ls" not in again


def _record(key: str, tool: str = "exec") -> AuditRecord:
    return AuditRecord(
        time=1.0, request_id="", caller="", sandbox_key=key, agent_id="", provider="",
        tool=tool, arguments_json="{}", policy_step="allowed",
    )  # fmt: skip


def test_audit_is_per_tenant(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "db")
    try:
        log.record(_record(scope("a", "k")))
        log.record(_record(scope("b", "k")))
        log.record(_record("k"))
        mine = log._query(AuditQuery(tenant="a"))
        assert [(r.tenant, r.sandbox_key) for r in mine] == [("a", "k")]
        assert [r.tenant for r in log._query(AuditQuery(tenant="b", sandbox_key="k"))] == ["b"]
        assert [r.tenant for r in log._query(AuditQuery())] == [""]
        assert log._query(AuditQuery(tenant="c")) == []
    finally:
        log.close()


def test_database_of_an_older_version_is_migrated(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "db")
    db.executescript(
        "CREATE TABLE audit (id INTEGER PRIMARY KEY AUTOINCREMENT, time REAL NOT NULL,"
        " request_id TEXT NOT NULL, caller TEXT NOT NULL, sandbox_key TEXT NOT NULL,"
        " agent_id TEXT NOT NULL, provider TEXT NOT NULL, tool TEXT NOT NULL,"
        " arguments_json TEXT NOT NULL, policy_step TEXT NOT NULL, guard_rule TEXT NOT NULL,"
        " approval TEXT NOT NULL, approver TEXT NOT NULL, duration_ms INTEGER NOT NULL,"
        " exit_code INTEGER NOT NULL, output_bytes INTEGER NOT NULL,"
        " redactions INTEGER NOT NULL, error_code TEXT NOT NULL, is_error INTEGER NOT NULL);"
        "INSERT INTO audit VALUES (NULL, 1.0, '', '', 'old', '', '', 'exec', '{}', 'allowed',"
        " '', '', '', 0, 0, 0, 0, '', 0);"
        "CREATE TABLE approved_commands (command TEXT PRIMARY KEY, approver TEXT NOT NULL,"
        " time REAL NOT NULL);"
        "INSERT INTO approved_commands VALUES ('make test', 'alice', 1.0);"
    )
    db.close()
    always = AllowAlways(tmp_path / "db")
    assert "make test" in always
    assert always.commands() == ["make test"]
    log = AuditLog(tmp_path / "db")
    try:
        log.record(_record(scope("a", "new")))
        assert [r.sandbox_key for r in log._query(AuditQuery())] == ["old"]
        assert [r.sandbox_key for r in log._query(AuditQuery(tenant="a"))] == ["new"]
    finally:
        log.close()
    assert AllowAlways(tmp_path / "db").commands() == ["make test"]  # migrating twice is a no-op


# --- per-tenant limits ------------------------------------------------------------------


def quota_manager(tmp_path: Path, backend: FakeBackend, **tenants: TenantConfig) -> SandboxManager:
    config = Config(
        state_dir=tmp_path, sandbox=SandboxConfig(user="1000:1000", memory_mb=256), tenants=tenants
    )
    return fake_manager(config, backend)


async def test_limits_hold_under_concurrent_first_calls(tmp_path: Path) -> None:
    backend = FakeBackend()
    mgr = quota_manager(tmp_path, backend, a=TenantConfig(max_sandboxes=3))
    results = await asyncio.gather(
        *(mgr.ensure(scope("a", f"k{i}")) for i in range(10)), return_exceptions=True
    )
    assert sum(not isinstance(r, BaseException) for r in results) == 3
    assert all(isinstance(r, QuotaExceeded) for r in results if isinstance(r, BaseException))
    assert backend.runs == 3
    made = [f"k{i}" for i, r in enumerate(results) if not isinstance(r, BaseException)]
    refused = [f"k{i}" for i, r in enumerate(results) if isinstance(r, BaseException)]
    await mgr.ensure(scope("b", refused[0]))  # another tenant is not counted
    await mgr.ensure(scope("a", made[0]))  # nor is the sandbox itself, asked again
    await mgr.destroy(scope("a", made[0]), delete_workspace=False)
    await mgr.ensure(scope("a", refused[0]))
    with pytest.raises(QuotaExceeded, match="at most 3 sandbox"):
        await mgr.ensure(scope("a", refused[1]))


async def test_memory_limit(tmp_path: Path) -> None:
    backend = FakeBackend()
    mgr = quota_manager(tmp_path, backend, **{"*": TenantConfig(max_memory_mb=600)})
    await mgr.ensure(scope("t", "one"))
    await mgr.ensure(scope("t", "two"))
    with pytest.raises(QuotaExceeded, match="600 MiB") as info:
        await mgr.ensure(scope("t", "three"))
    assert "768 MiB" in str(info.value)
    await mgr.ensure("no-tenant-is-not-limited")


async def test_labels_carry_the_tenant_and_adoption_keeps_it(tmp_path: Path) -> None:
    backend = FakeBackend()
    mgr = quota_manager(tmp_path, backend)
    await mgr.start()
    sandbox = await mgr.ensure(scope("a", "k"))
    labels = backend.containers[sandbox.info.id].labels
    assert labels["io.stockade.key"] == "k"
    assert labels["io.stockade.tenant"] == "a"
    await mgr.ensure("k")
    await mgr.close()
    again = quota_manager(tmp_path, backend)
    adopted = await again.start()
    assert sorted(adopted) == sorted([scope("a", "k"), "k"])
