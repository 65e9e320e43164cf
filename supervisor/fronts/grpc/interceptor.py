"""The server interceptor that authenticates every call before its handler runs, and the
caller's tenant for the handlers. Health checking and reflection stay open: they name
services, never sandboxes, and launchers and load balancers probe them without credentials.
It also turns a request that does not parse (a string field that is not UTF-8, a corrupt
message) into INVALID_ARGUMENT; gRPC itself would answer UNKNOWN with a Python class name."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from stockade.supervisor.auth import Authenticator
from stockade.supervisor.errors import InvalidRequest, Unauthenticated
from stockade.supervisor.fronts.grpc import wire
from stockade.supervisor.observe.refusals import Refusals, address_of_peer

OPEN_SERVICES = frozenset({"grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"})
REASON_KEY = "stockade-error-reason"
_TENANT: ContextVar[str] = ContextVar("stockade_tenant")
_CERT_NAMES = ("x509_subject_alternative_name", "x509_common_name")
FRONT = "grpc"


def current_tenant() -> str:
    """The tenant of the call being handled ("" with auth off). Raises LookupError outside a
    call the interceptor saw: a handler that scoped a key without it would fail open."""
    return _TENANT.get()


class AuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """With an authenticator, wraps every handler of a closed service so that it first
    authenticates (UNAUTHENTICATED on failure) and sets the tenant; without one (auth off)
    it sets the tenant "" for every call. Each refusal is told to `refusals` (audited,
    bounded per client address: observe/refusals.py)."""

    def __init__(
        self, authenticator: Authenticator | None, refusals: Refusals | None = None
    ) -> None:
        self._authenticator = authenticator
        self._refusals = refusals

    async def intercept_service(
        self,
        continuation: Callable[[Any], Awaitable[Any]],
        handler_call_details: Any,
    ) -> Any:
        handler = await continuation(handler_call_details)
        service = handler_call_details.method.lstrip("/").split("/")[0]
        if handler is None or service in OPEN_SERVICES:
            return handler
        return _wrapped(handler, self._enter)

    async def _enter(self, context: Any) -> None:
        if self._authenticator is None:
            _TENANT.set("")
            return
        metadata = context.invocation_metadata() or ()
        authorization = [str(v) for k, v in metadata if k == "authorization"]
        auth = context.auth_context() or {}
        names = [n.decode("utf-8", "replace") for key in _CERT_NAMES for n in auth.get(key, ())]
        try:
            tenant = self._authenticator.authenticate(authorization, names)
        except Unauthenticated as exc:
            if self._refusals is not None:
                self._refusals.refused(FRONT, address_of_peer(context.peer()), str(exc))
            context.set_trailing_metadata(((REASON_KEY, exc.reason),))
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))
        _TENANT.set(tenant)


class _Malformed:
    """A request message that did not parse; its handler is not called."""

    def __init__(self, why: str) -> None:
        self.message = f"malformed request: {why}"


def _tolerant(deserializer: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    descriptor = getattr(getattr(deserializer, "__self__", None), "DESCRIPTOR", None)

    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except DecodeError as exc:
            return _Malformed(wire.problem(descriptor, data) if descriptor else str(exc))

    return deserialize


async def _parsed(request: Any, context: Any) -> Any:
    """`request`, or the call ends with INVALID_ARGUMENT when it did not parse."""
    if isinstance(request, _Malformed):
        context.set_trailing_metadata(((REASON_KEY, InvalidRequest.reason),))
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
    return request


async def _parsed_stream(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """The caller's messages; one that did not parse raises InvalidRequest in the handler
    (whose error mapping answers INVALID_ARGUMENT)."""
    async for request in requests:
        if isinstance(request, _Malformed):
            raise InvalidRequest(request.message)
        yield request


def _wrapped(handler: Any, enter: Callable[[Any], Awaitable[None]]) -> Any:
    """The same handler, authenticating first and refusing requests that do not parse (for
    each of the four kinds of RPC)."""
    codec = {
        "request_deserializer": _tolerant(handler.request_deserializer),
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary:
        inner_uu = handler.unary_unary

        async def unary_unary(request: Any, context: Any) -> Any:
            await enter(context)
            return await inner_uu(await _parsed(request, context), context)

        return grpc.unary_unary_rpc_method_handler(unary_unary, **codec)
    if handler.stream_unary:
        inner_su = handler.stream_unary

        async def stream_unary(requests: Any, context: Any) -> Any:
            await enter(context)
            return await inner_su(_parsed_stream(requests), context)

        return grpc.stream_unary_rpc_method_handler(stream_unary, **codec)
    if handler.unary_stream:
        inner_us = handler.unary_stream

        async def unary_stream(request: Any, context: Any) -> AsyncIterator[Any]:
            await enter(context)
            async for item in inner_us(await _parsed(request, context), context):
                yield item

        return grpc.unary_stream_rpc_method_handler(unary_stream, **codec)
    inner_ss = handler.stream_stream

    async def stream_stream(requests: Any, context: Any) -> AsyncIterator[Any]:
        await enter(context)
        async for item in inner_ss(_parsed_stream(requests), context):
            yield item

    return grpc.stream_stream_rpc_method_handler(stream_stream, **codec)
