"""GET /v2/sandboxes as the SDKs send it: the double-encoded metadata filter, the
comma-joined states, order, startedAfter, template, and paging by `limit` and an opaque
`nextToken` (answered in the `x-next-token` header; absent on the last page)."""

from __future__ import annotations

import base64
import binascii
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from stockade.supervisor.fronts.e2b.records import PAUSED, RUNNING, E2bSandbox
from stockade.supervisor.fronts.e2b.wire import ApiError

DEFAULT_LIMIT = 100
MAX_LIMIT = 100
NEXT_TOKEN_HEADER = "x-next-token"


@dataclass(frozen=True)
class ListQuery:
    metadata: dict[str, str]
    states: frozenset[str]
    descending: bool
    started_after: float | None
    template: str
    limit: int
    after: tuple[float, str] | None
    """The (started_at, sandbox_id) of the last item of the previous page."""


def parse_metadata(raw: str) -> dict[str, str]:
    """The `metadata` query value, decoded once already by the query parser: a query string
    whose keys and values are percent-encoded once more (SDKs: quote, then urlencode)."""
    pairs = urllib.parse.parse_qsl(raw, keep_blank_values=True, strict_parsing=False)
    return {urllib.parse.unquote(k): urllib.parse.unquote(v) for k, v in pairs}


def parse_states(values: Sequence[str]) -> frozenset[str]:
    """`state=running,paused` (or repeated): the states asked for; none given: both."""
    states = {s.strip() for v in values for s in v.split(",") if s.strip()}
    unknown = states - {RUNNING, PAUSED}
    if unknown:
        raise ApiError(400, f"unknown sandbox state(s) {sorted(unknown)}: running or paused")
    return frozenset(states or {RUNNING, PAUSED})


def encode_token(after: tuple[float, str]) -> str:
    return base64.urlsafe_b64encode(f"{after[0]!r}/{after[1]}".encode()).decode().rstrip("=")


def decode_token(token: str) -> tuple[float, str]:
    try:
        text = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
        started, _, sandbox_id = text.partition("/")
        return float(started), sandbox_id
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise ApiError(400, "invalid nextToken") from None


def parse_query(params: dict[str, list[str]]) -> ListQuery:
    """The query of a list request (values as lists, repeated parameters kept)."""

    def one(name: str) -> str:
        values = params.get(name) or [""]
        return values[-1]

    limit = DEFAULT_LIMIT
    if one("limit"):
        try:
            limit = int(one("limit"))
        except ValueError:
            raise ApiError(400, "limit must be an integer") from None
        if not 1 <= limit <= MAX_LIMIT:
            raise ApiError(400, f"limit must be between 1 and {MAX_LIMIT}, got {limit}")
    order = one("order") or "desc"
    if order not in ("asc", "desc"):
        raise ApiError(400, f"order must be asc or desc, got {order[:20]!r}")
    started_after = None
    if one("startedAfter"):
        try:
            moment = datetime.fromisoformat(one("startedAfter"))
        except ValueError:
            raise ApiError(400, "startedAfter must be an ISO 8601 time") from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        started_after = moment.timestamp()
    return ListQuery(
        metadata=parse_metadata(one("metadata")) if one("metadata") else {},
        states=parse_states(params.get("state", [])),
        descending=order == "desc",
        started_after=started_after,
        template=one("template"),
        limit=limit,
        after=decode_token(one("nextToken")) if one("nextToken") else None,
    )


def matches(sandbox: E2bSandbox, state: str, query: ListQuery) -> bool:
    if state not in query.states:
        return False
    if query.template and sandbox.template_id != query.template:
        return False
    if query.started_after is not None and sandbox.started_at <= query.started_after:
        return False
    return all(sandbox.metadata.get(k) == v for k, v in query.metadata.items())


def page(found: Sequence[E2bSandbox], query: ListQuery) -> tuple[list[E2bSandbox], str | None]:
    """One page of the matching sandboxes (already filtered), in the asked order, and the
    token of the next page (None: this is the last)."""

    def position(s: E2bSandbox) -> tuple[float, str]:
        return (s.started_at, s.sandbox_id)

    ordered = sorted(found, key=position, reverse=query.descending)
    if query.after is not None:
        after = query.after
        if query.descending:
            ordered = [s for s in ordered if position(s) < after]
        else:
            ordered = [s for s in ordered if position(s) > after]
    chosen = ordered[: query.limit]
    more = len(ordered) > query.limit
    return chosen, (encode_token(position(chosen[-1])) if more and chosen else None)
