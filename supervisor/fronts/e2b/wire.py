"""HTTP details of the E2B control plane shared by its handlers: errors as the SDKs parse
them (JSON `{"code": <int>, "message": <str>}` for every status), the caller's tenant from its
X-API-KEY, and request bodies read within the configured size limit (fronts/bodies.py: the
Content-Length first, gzip and deflate decoded within it, JSON nested at most 64 deep)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from stockade.supervisor import errors
from stockade.supervisor.auth import Authenticator
from stockade.supervisor.fronts import bodies

API_KEY_HEADER = "x-api-key"
MAX_KEY_CHARS = 4096


class ApiError(Exception):
    """An answer other than success: its HTTP status and message (and extra headers)."""

    def __init__(self, status: int, message: str, headers: Mapping[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = dict(headers or {})


def not_found(sandbox_id: str) -> ApiError:
    """An unknown sandbox, or another tenant's: the same answer, so ids cannot be probed."""
    return ApiError(404, f"sandbox {sandbox_id[:64]!r} not found")


def error_response(
    status: int, message: str, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    """The body both SDKs parse (Python: Error.from_dict; JS: `error.code === 404`)."""
    return JSONResponse({"code": status, "message": message}, status_code=status, headers=headers)


def from_domain(exc: errors.StockadeError) -> ApiError:
    """A supervisor error as an API answer. Retry-prone statuses (429, 503) carry
    `Should-Retry: false`: the Python SDK replays them three times otherwise."""
    no_retry = {"Should-Retry": "false"}
    if isinstance(exc, errors.SandboxNotFound):
        return ApiError(404, str(exc))
    if isinstance(exc, errors.QuotaExceeded):
        return ApiError(429, str(exc), no_retry)
    if isinstance(exc, errors.EngineUnavailable):
        return ApiError(503, str(exc), no_retry)
    if isinstance(exc, errors.InvalidRequest):
        return ApiError(400, str(exc))
    if isinstance(exc, errors.PolicyDenied):
        return ApiError(403, str(exc))
    return ApiError(500, str(exc))


def tenant_of(authenticator: Authenticator | None, headers: Mapping[str, str]) -> str:
    """The caller's tenant from its X-API-KEY (a Stockade bearer token); "" with auth off,
    whatever the key. ApiError 401 for a missing or unknown key."""
    if authenticator is None:
        return ""
    key = headers.get(API_KEY_HEADER, "").strip()
    if not key:
        raise ApiError(401, "missing X-API-KEY: send a Stockade token as the E2B API key")
    if len(key) > MAX_KEY_CHARS or any(c.isspace() for c in key):
        raise ApiError(401, "invalid API key")
    try:
        return authenticator.authenticate([f"Bearer {key}"], ())
    except errors.Unauthenticated:
        raise ApiError(401, "invalid API key") from None


async def read_json(request: Request, limit: int, *, required: bool = False) -> dict[str, Any]:
    """The request's JSON object body ({} when empty and not required); ApiError 400 for
    anything else, 413 past `limit` bytes (declared or sent, or decoded), 415 for a
    Content-Encoding not taken."""
    try:
        body = await bodies.read_body(request, limit)
        if not body.strip():
            if required:
                raise ApiError(400, "a JSON object body is required")
            return {}
        data = bodies.loads(body)
    except bodies.BodyRefused as exc:
        bodies.tell(request, exc)
        raise ApiError(exc.status, exc.message) from None
    except ValueError:
        raise ApiError(400, "the request body is not JSON") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return data


def string_map(
    value: Any, name: str, max_entries: int = 1024, max_chars: int = 65536, max_bytes: int = 0
) -> dict[str, str]:
    """An object of strings to strings (None: empty); ApiError 400 otherwise, and when its
    keys and values take more than `max_bytes` in UTF-8 (0: no such limit)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ApiError(400, f"{name} must be an object of strings")
    if len(value) > max_entries:
        raise ApiError(400, f"{name} may have at most {max_entries} entries")
    found: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not isinstance(item, str):
            raise ApiError(400, f"{name} must map strings to strings")
        if not key or len(key) > 256 or len(item) > max_chars or "\0" in key + item:
            raise ApiError(400, f"{name}: entry {key[:64]!r} is empty, too long or has a NUL")
        found[key] = item
    if max_bytes:
        size = sum(len(k.encode("utf-8", "surrogatepass")) + len(v.encode("utf-8", "surrogatepass"))
                   for k, v in found.items())  # fmt: skip
        if size > max_bytes:
            raise ApiError(
                400, f"{name} takes {size} bytes, more than this server keeps for a sandbox "
                f"({max_bytes}: e2b.max_metadata_bytes)",
            )  # fmt: skip
    return found


def seconds(value: Any, name: str, maximum: int) -> int:
    """A whole number of seconds in [0, maximum]; ApiError 400 otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise ApiError(400, f"{name} must be a number of seconds")
    if value < 0 or value > maximum:
        raise ApiError(400, f"{name} must be between 0 and {maximum} seconds, got {value}")
    return int(value)
