"""The agent on a TCP port (a Kubernetes pod's): mutual TLS, and supervisors only.

A TCP port that runs commands would be a shell for anyone who reaches it, so the agent never
serves one in plain text. The TLS folder (the pod's Secret) holds ca.crt, tls.crt and tls.key:
the agent presents tls.crt and requires of every client a certificate that ca.crt issued
(require_client_auth). That alone would admit any certificate of the installation's CA,
including another sandbox's agent certificate, which the code in that sandbox can read; so
every call is checked too: the client's certificate must carry the SAN URI SUPERVISOR_URI,
which only supervisors' certificates have (supervisor/kube/pki.py). Anything else ends with
UNAUTHENTICATED before the handler runs.

Standard library and grpcio only (the image has no `cryptography`): grpc's auth context
already lists the peer's URI SANs (`peer_uri`), from the certificate it verified.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, Final

import grpc

SUPERVISOR_URI: Final = "spiffe://stockade/supervisor"
"""The SAN URI of supervisors' client certificates; the agent admits no other peer."""
FILES: Final = ("ca.crt", "tls.crt", "tls.key")
URI_PROPERTY: Final = "peer_uri"
"""grpc's auth-context property of the peer certificate's URI SANs (and nothing else: DNS
names are in x509_subject_alternative_name, mixed with URIs)."""
REFUSED: Final = "this agent serves Stockade supervisors only (client certificate not admitted)"


def parse_listen(value: str) -> tuple[str, int]:
    """'HOST:PORT' or '[V6]:PORT' -> (host, port); ValueError in words otherwise."""
    host, sep, port = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--listen must be HOST:PORT (0.0.0.0:7443, [::]:7443), not {value!r}")
    return host, int(port)


def server_credentials(tls_dir: Path) -> grpc.ServerCredentials:
    """The agent's certificate and key, and client certificates required, of the CA in
    `tls_dir`. OSError naming the file when one cannot be read."""
    ca, cert, key = (_read(tls_dir / name) for name in FILES)
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=True
    )


def _read(path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise OSError(exc.errno, f"cannot read {path}: {exc.strerror}") from None
    if not data.strip():
        raise OSError(f"{path} is empty")
    return data


def admitted(context: Any) -> bool:
    """Whether the call's peer presented a supervisor's certificate (grpc verified its
    chain against ca.crt before any call: require_client_auth)."""
    uris = context.auth_context().get(URI_PROPERTY, [])
    return SUPERVISOR_URI.encode() in uris


class SupervisorsOnly(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Wraps every method so that its call is refused, UNAUTHENTICATED, unless admitted()
    (grpc.aio's interceptors see no peer before the handler: the check runs in the wrapper,
    first)."""

    async def intercept_service(
        self,
        continuation: Callable[[Any], Awaitable[Any]],
        handler_call_details: Any,
    ) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        codec = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(_single(handler.unary_unary), **codec)
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(_single(handler.stream_unary), **codec)
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(_streamed(handler.unary_stream), **codec)
        return grpc.stream_stream_rpc_method_handler(_streamed(handler.stream_stream), **codec)


async def _refuse(context: Any) -> None:
    if not admitted(context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, REFUSED)


def _single(behavior: Callable[[Any, Any], Awaitable[Any]]) -> Callable[[Any, Any], Any]:
    async def checked(request: Any, context: Any) -> Any:
        await _refuse(context)
        return await behavior(request, context)

    return checked


def _streamed(behavior: Callable[[Any, Any], AsyncIterator[Any]]) -> Callable[[Any, Any], Any]:
    async def checked(request: Any, context: Any) -> AsyncIterator[Any]:
        await _refuse(context)
        async for reply in behavior(request, context):
            yield reply

    return checked
