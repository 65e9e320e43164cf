"""envd's signed file URLs: `sandbox.download_url(path)` and `upload_url(path)` of a sandbox
with an access token (every E2B sandbox here has one, as a `secure` one on E2B). The SDK signs
`path:operation:username:access_token[:expiration]` with SHA-256 (`v1_` and the unpadded
base64 of the digest; operation `read` for GET, `write` for POST; expiration in unix seconds,
absent: no end) and puts the signature, the expiration and the username in the query of
`{sandbox_url}/files`, with no sandbox header: the URL is meant to be handed to someone
without the token. Which sandbox it is for is therefore found from the signature itself: the
one live sandbox whose token signs that request (each candidate checked in constant time;
at most the sandboxes on record, each one SHA-256 of ~100 bytes). An expired signature is
401 "signature is already expired", one that signs for no sandbox 401 "invalid signature",
as envd answers; the request then goes on as an envd `/files` request of that sandbox
(policy and audit as any file call)."""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Iterable, Mapping

from stockade.supervisor.fronts.e2b.records import E2bSandbox

PREFIX = "v1_"
MAX_SIGNED_FIELD = 4096
"""The longest path or username a signed request may carry (a request head is bounded
anyway; this keeps each candidate's hash small)."""
OPERATIONS = {"GET": "read", "POST": "write"}


class SignatureRefused(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def signature(
    path: str, operation: str, username: str, access_token: str, expiration: int | None
) -> str:
    """The SDK's v1 signature (e2b/sandbox/signature.py, js-sdk's getSignature)."""
    raw = f"{path}:{operation}:{username}:{access_token}"
    if expiration is not None:
        raw += f":{expiration}"
    digest = hashlib.sha256(raw.encode("utf-8")).digest()
    return PREFIX + base64.b64encode(digest).rstrip(b"=").decode("ascii")


def is_signed(method: str, path: str, query: Mapping[str, str]) -> bool:
    """Whether a request without a sandbox header is a signed `/files` one."""
    return path == "/files" and method in OPERATIONS and "signature" in query


def signed_sandbox(
    method: str, query: Mapping[str, str], sandboxes: Iterable[E2bSandbox], now: float
) -> E2bSandbox:
    """The live sandbox whose access token signs this `/files` request; SignatureRefused
    (401's message) when none does or its signature has expired."""
    given = query.get("signature", "")
    path = query.get("path", "")
    username = query.get("username", "")
    raw_expiration = query.get("signature_expiration")
    if not given.startswith(PREFIX) or len(given) > 64:
        raise SignatureRefused("invalid signature")
    if len(path) > MAX_SIGNED_FIELD or len(username) > MAX_SIGNED_FIELD:
        raise SignatureRefused("invalid signature")
    expiration: int | None = None
    if raw_expiration is not None:
        text = raw_expiration.removeprefix("-")
        if not text.isdigit() or len(text) > 12:
            raise SignatureRefused("invalid signature expiration")
        expiration = int(raw_expiration)
    operation = OPERATIONS[method]
    wanted = given.encode("ascii", "replace")
    found = None
    for sandbox in sandboxes:
        if sandbox.ended(now):
            continue
        mine = signature(path, operation, username, sandbox.access_token, expiration)
        if hmac.compare_digest(mine.encode(), wanted):
            found = sandbox
    if found is None:
        raise SignatureRefused("invalid signature")
    if expiration is not None and expiration < now:
        raise SignatureRefused("signature is already expired")
    return found
