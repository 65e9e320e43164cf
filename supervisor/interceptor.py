"""The server interceptor that authenticates every call before its handler runs, and the
caller's tenant for the handlers. Health checking and reflection stay open: they name
services, never sandboxes, and launchers and load balancers probe them without credentials."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from typing import Any

import grpc

from stockade.supervisor.auth import Authenticator
from stockade.supervisor.errors import Unauthenticated

OPEN_SERVICES = frozenset({"grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"})
REASON_KEY = "stockade-error-reason"
_TENANT: ContextVar[str] = ContextVar("stockade_tenant")
_CERT_NAMES = ("x509_subject_alternative_name", "x509_common_name")


def current_tenant() -> str:
    """The tenant of the call being handled ("" with auth off). Raises LookupError outside a
    call the interceptor saw: a handler that scoped a key without it would fail open."""
    return _TENANT.get()


class AuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """With an authenticator, wraps every handler of a closed service so that it first
    authenticates (UNAUTHENTICATED on failure) and sets the tenant; without one (auth off)
    it sets the tenant "" for every call."""

    def __init__(self, authenticator: Authenticator | None) -> None:
        self._authenticator = authenticator

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
            context.set_trailing_metadata(((REASON_KEY, exc.reason),))
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))
        _TENANT.set(tenant)


def _wrapped(handler: Any, enter: Callable[[Any], Awaitable[None]]) -> Any:
    """The same handler, authenticating first (for each of the four kinds of RPC)."""
    codec = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary:
        inner_uu = handler.unary_unary

        async def unary_unary(request: Any, context: Any) -> Any:
            await enter(context)
            return await inner_uu(request, context)

        return grpc.unary_unary_rpc_method_handler(unary_unary, **codec)
    if handler.stream_unary:
        inner_su = handler.stream_unary

        async def stream_unary(requests: Any, context: Any) -> Any:
            await enter(context)
            return await inner_su(requests, context)

        return grpc.stream_unary_rpc_method_handler(stream_unary, **codec)
    inner = handler.unary_stream or handler.stream_stream

    async def streaming(request: Any, context: Any) -> AsyncIterator[Any]:
        await enter(context)
        async for item in inner(request, context):
            yield item

    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(streaming, **codec)
    return grpc.stream_stream_rpc_method_handler(streaming, **codec)
