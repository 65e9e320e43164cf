"""envd's signed file URLs (fronts/e2b/signed.py): a URL the SDK signs (its own signing
code) reaches envd as its sandbox's; one forged, altered, expired, for another operation, for
an ended sandbox or oversized is 401 with envd's message, audited as a refused
authentication. Served for real with the SDK's download_url/upload_url in
tests/integration/test_e2b_files.py."""

from __future__ import annotations

import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
from e2b.sandbox.signature import get_signature

from stockade.supervisor.config import Config
from stockade.supervisor.fronts.backoff import presents
from stockade.supervisor.fronts.e2b import signed
from stockade.supervisor.fronts.e2b.control import Control
from stockade.supervisor.fronts.e2b.records import PAUSED, E2bSandbox, Records
from stockade.supervisor.fronts.e2b.server import SANDBOX_STATE, Dispatch, _credentials
from stockade.supervisor.observe.refusals import Refusals
from tests.unit.fakes import Audited, e2b_context
from tests.unit.test_e2b_front import Recorder, call, sandbox


def sdk_query(
    box: E2bSandbox,
    path: str,
    operation: Any = "read",
    user: str | None = None,
    expires_in: int | None = None,
) -> str:
    """The query of the SDK's download_url/upload_url (sandbox/main.py's _file_url)."""
    sig = get_signature(path, operation, user, box.access_token, expires_in)
    query = {"path": path}
    if user:
        query["username"] = user
    query["signature"] = sig["signature"]
    if sig["expiration"] is not None:
        query["signature_expiration"] = str(sig["expiration"])
    return urllib.parse.urlencode(query, quote_via=urllib.parse.quote)


async def served(tmp_path: Path, *boxes: E2bSandbox) -> tuple[Dispatch, Recorder, Audited]:
    records = Records(None)
    for box in boxes:
        await records.add(box)
    audit = Audited()
    ctx = e2b_context(Config(state_dir=tmp_path), records, refusals=Refusals(audit))
    envd = Recorder()
    return Dispatch(ctx, Recorder(), envd, Control(ctx)), envd, audit


def test_the_signature_is_the_sdks() -> None:
    got = get_signature("/home/user/a b.txt", "write", "user", "tok", 300)
    assert got["expiration"] is not None
    assert (
        signed.signature("/home/user/a b.txt", "write", "user", "tok", got["expiration"])
        == (got["signature"])
    )
    assert (
        signed.signature("x", "read", "", "tok", None)
        == (get_signature("x", "read", None, "tok")["signature"])
    )


async def test_a_signed_url_reaches_its_own_sandbox(tmp_path: Path) -> None:
    now = time.time()
    mine, theirs = sandbox(started=now), sandbox("other", started=now)
    app, envd, _audit = await served(tmp_path, mine, theirs)
    for method, operation, user, expires in (
        ("GET", "read", None, None),
        ("GET", "read", "user", 120),
        ("POST", "write", "user", None),
        ("POST", "write", None, 60),
    ):
        query = sdk_query(mine, "dir/ü ?&.txt", operation, user, expires)
        status, _ = await call(app, {}, method, "/files", query)
        assert status == 204
        assert envd.scopes[-1]["state"][SANDBOX_STATE] is mine
    status, _ = await call(app, {}, "GET", "/files", sdk_query(theirs, "/tmp/x"))
    assert status == 204
    assert envd.scopes[-1]["state"][SANDBOX_STATE] is theirs  # its token: its sandbox


def altered(query: str, **changes: str) -> str:
    values = dict(urllib.parse.parse_qsl(query))
    values.update(changes)
    return urllib.parse.urlencode(values)


async def test_forged_altered_or_expired_urls_are_refused(tmp_path: Path) -> None:
    now = time.time()
    live = sandbox(started=now)
    ended = sandbox(started=now - 1000, end_at=now - 1)
    app, envd, audit = await served(tmp_path, live, ended)
    good = sdk_query(live, "notes.txt", "read", "user", 120)
    forged = E2bSandbox(**{**live.__dict__, "access_token": "guessed"})
    refused = {
        "a guessed token": sdk_query(forged, "notes.txt"),
        "another path": altered(good, path="/home/user/.ssh/id_rsa"),
        "another user": altered(good, username="root"),
        "a later expiry": altered(good, signature_expiration=str(int(now) + 99_999)),
        "no expiry": urllib.parse.urlencode(
            {k: v for k, v in urllib.parse.parse_qsl(good) if k != "signature_expiration"}
        ),
        "an ended sandbox's": sdk_query(ended, "notes.txt"),
        "not v1": altered(good, signature="v2_" + "A" * 43),
        "too long": altered(good, signature="v1_" + "A" * 100),
        "a huge path": altered(good, path="a" * 5000),
        "a bad expiry": altered(good, signature_expiration="soon"),
        "a huge expiry": altered(good, signature_expiration="9" * 40),
    }
    for why, query in refused.items():
        status, body = await call(app, {}, "GET", "/files", query)
        assert status == 401, why
        assert body is not None
        assert body["message"].startswith(("invalid signature", "signature")), why
    status, body = await call(app, {}, "POST", "/files", good)  # a read URL used to write
    assert (status, body) == (401, {"code": 401, "message": "invalid signature"})
    expired = sdk_query(live, "notes.txt", "read", "user", -120)
    status, body = await call(app, {}, "GET", "/files", expired)
    assert (status, body) == (401, {"code": 401, "message": "signature is already expired"})
    assert envd.scopes == []
    (record,) = audit.records  # from one address: one record in its window
    assert "signed URL" in record.policy_step
    assert live.access_token not in record.arguments_json + record.policy_step


async def test_a_paused_sandboxs_signed_url_is_502(tmp_path: Path) -> None:
    paused = sandbox(started=time.time(), state=PAUSED)
    app, envd, _audit = await served(tmp_path, paused)
    status, body = await call(app, {}, "GET", "/files", sdk_query(paused, "a.txt"))
    assert status == 502
    assert body is not None
    assert "paused" in body["message"]
    assert envd.scopes == []


@pytest.mark.parametrize("path", ["/health", "/sandboxes", "/files"])
async def test_without_a_signature_it_is_the_control_planes(tmp_path: Path, path: str) -> None:
    box = sandbox(started=time.time())
    app, envd, _audit = await served(tmp_path, box)
    status, _ = await call(app, {}, "GET", path, "path=a.txt")
    assert status == 204  # the control plane's Recorder
    assert envd.scopes == []


def test_a_signature_counts_as_presented_credentials() -> None:
    presented = _credentials(presents(b"x-api-key"))
    scope: dict[str, Any] = {"path": "/files", "query_string": b"path=a&signature=v1_x"}
    assert presented({**scope, "headers": []}) == b"signature=v1_x"
    assert presented({**scope, "path": "/other", "headers": []}) is None
    assert presented({"path": "/files", "query_string": b"path=a", "headers": []}) is None
    assert presented({**scope, "headers": [(b"x-api-key", b"k")]}) == b"x-api-key=k"
