"""The one table from domain error to gRPC status, and the decorators that apply it to every
handler: a domain error ends the call with its status, its message scrubbed and a stable
reason in trailing metadata; a bug shows as INTERNAL, never as a Python class path; a stray
cancellation as UNAVAILABLE (_stray)."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, NoReturn, Protocol, TypeVar

import grpc

from stockade.supervisor import errors
from stockade.supervisor.fronts.grpc.interceptor import REASON_KEY
from stockade.supervisor.policy.scrub.scrubber import Scrubber

log = logging.getLogger("stockade.server")
_STATUS = {
    errors.InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
    errors.Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    errors.QuotaExceeded: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.ApproverBehind: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    errors.Unsupported: grpc.StatusCode.UNIMPLEMENTED,
    errors.PolicyDenied: grpc.StatusCode.PERMISSION_DENIED,
    errors.EngineUnavailable: grpc.StatusCode.UNAVAILABLE,
    errors.StateUnavailable: grpc.StatusCode.UNAVAILABLE,
    errors.HostExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.SandboxBroken: grpc.StatusCode.UNAVAILABLE,
    errors.SandboxLost: grpc.StatusCode.UNAVAILABLE,
    errors.ConfigError: grpc.StatusCode.FAILED_PRECONDITION,
    errors.SandboxStateConflict: grpc.StatusCode.FAILED_PRECONDITION,
}


class Context(Protocol):
    """What the handlers use of `grpc.aio.ServicerContext` (grpc ships no type stubs)."""

    def peer(self) -> str: ...

    def invocation_metadata(self) -> Sequence[tuple[str, str | bytes]] | None: ...

    def set_trailing_metadata(self, trailing_metadata: Sequence[tuple[str, str]]) -> None: ...

    async def abort(self, code: Any, details: str = "") -> NoReturn: ...


class Servicer(Protocol):
    """A servicer: its scrubber (if any) cleans the messages of the errors it reports."""

    @property
    def scrubber(self) -> Scrubber | None: ...


S = TypeVar("S", bound=Servicer)
Q = TypeVar("Q")
R = TypeVar("R")


def status_for(exc: errors.StockadeError) -> Any:
    """The grpc.StatusCode for a domain error: the entry of its nearest class in the table."""
    for cls in type(exc).__mro__:
        if cls in _STATUS:
            return _STATUS[cls]
    return grpc.StatusCode.INTERNAL


async def _abort(
    context: Context, exc: Exception, where: str, scrubber: Scrubber | None
) -> NoReturn:
    """End the RPC with the status for `exc` (its message scrubbed) and a stable reason in
    trailing metadata; a bug shows as INTERNAL, never as a Python class path."""
    if isinstance(exc, errors.StockadeError):
        message = str(exc) if scrubber is None else scrubber.scrub(str(exc))[0]
        context.set_trailing_metadata(((REASON_KEY, exc.reason),))
        await context.abort(status_for(exc), message)
    log.error("internal error in %s", where, exc_info=exc)
    context.set_trailing_metadata(((REASON_KEY, "INTERNAL"),))
    await context.abort(grpc.StatusCode.INTERNAL, "internal error; see the supervisor log")


STRAY = "an internal call was cut short (its sandbox was replaced meanwhile); try again"


def _stray() -> errors.SandboxLost | None:
    """The error for a CancelledError that reached a handler while its task was not being
    cancelled: an inner grpc.aio call ended so when its channel closed (agent_link.py turns
    those it knows into errors). Passed on, it would end the handler as cancelled and gRPC
    would send the caller no status at all: a caller without a deadline would wait forever.
    None for a real cancellation (the caller went away, the server stops): raise it again."""
    task = asyncio.current_task()
    if task is None or task.cancelling():
        return None
    log.error("a handler was ended by a stray cancellation", exc_info=True)
    return errors.SandboxLost(STRAY)


def mapped(
    handler: Callable[[S, Q, Context], Awaitable[R]],
) -> Callable[[S, Q, Context], Awaitable[R]]:
    """Turn domain errors into gRPC statuses (handlers with one reply)."""

    @functools.wraps(handler)
    async def wrapper(self: S, request: Q, context: Context) -> R:
        try:
            return await handler(self, request, context)
        except Exception as exc:
            await _abort(context, exc, handler.__name__, self.scrubber)
        except asyncio.CancelledError:
            if (stray := _stray()) is None:
                raise
            await _abort(context, stray, handler.__name__, self.scrubber)
        raise AssertionError("unreachable")  # context.abort raises

    return wrapper


def mapped_stream(
    handler: Callable[[S, Q, Context], AsyncIterator[R]],
) -> Callable[[S, Q, Context], AsyncIterator[R]]:
    """mapped() for server-streaming handlers."""

    @functools.wraps(handler)
    async def wrapper(self: S, request: Q, context: Context) -> AsyncIterator[R]:
        try:
            async for item in handler(self, request, context):
                yield item
        except Exception as exc:
            await _abort(context, exc, handler.__name__, self.scrubber)
        except asyncio.CancelledError:
            if (stray := _stray()) is None:
                raise
            await _abort(context, stray, handler.__name__, self.scrubber)

    return wrapper
