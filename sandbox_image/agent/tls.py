"""The agent on a TCP port (a Kubernetes pod's): mutual TLS, and supervisors only.

A TCP port that runs commands would be a shell for anyone who reaches it, so the agent never
serves one in plain text. The TLS folder (the pod's Secret) holds ca.crt, tls.crt and tls.key:
the agent presents tls.crt and requires of every client a certificate that ca.crt issued
(require_client_auth). That alone would admit any certificate of the installation's CA,
including another sandbox's agent certificate, which the code in that sandbox can read; so
every call is checked too: the client's certificate must carry the SAN URI SUPERVISOR_URI,
which only supervisors' certificates have (supervisor/engines/backends/kubernetes/pki.py). Anything
else ends with UNAUTHENTICATED before the handler runs.

Standard library and grpcio only (the image has no `cryptography`): grpc's auth context
already lists the peer's URI SANs (`peer_uri`), from the certificate it verified.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, Final

import grpc

log = logging.getLogger("stockade.agent")
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
    `tls_dir`; read again at a new connection once the files changed (a Secret's volume is
    updated in place: a renewed certificate or a new CA needs no new pod). OSError naming the
    file when one cannot be read at start."""
    folder = _Folder(tls_dir)
    return grpc.dynamic_ssl_server_credentials(
        folder.initial, folder.changed, require_client_authentication=True
    )


class _Folder:
    """The TLS folder and what was last read from it (each file's inode, size and time)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.initial = self.configuration()
        self.seen = self._stamp()

    def _stamp(self) -> tuple[tuple[int, int, int], ...]:
        stats = [(self.path / name).stat() for name in FILES]  # through the Secret's links
        return tuple((s.st_ino, s.st_size, s.st_mtime_ns) for s in stats)

    def configuration(self) -> Any:
        ca, cert, key = (_read(self.path / name) for name in FILES)
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    def changed(self) -> Any:
        """grpc asks at each new connection: a new configuration, or None to keep the one it
        has (also while the files cannot be read: the kubelet swaps them in one rename)."""
        try:
            stamp = self._stamp()
            if stamp == self.seen:
                return None
            configuration = self.configuration()
        except OSError:
            return None
        self.seen = stamp
        log.info("TLS files in %s changed: read again", self.path)
        return configuration


def _read(path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise OSError(f"cannot read {path}: {exc.strerror}") from None
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
    first). Each method's handler is wrapped once, at its first call: every tool call
    passes here."""

    def __init__(self) -> None:
        self._wrapped: dict[str, Any] = {}

    async def intercept_service(
        self,
        continuation: Callable[[Any], Awaitable[Any]],
        handler_call_details: Any,
    ) -> Any:
        method = handler_call_details.method
        wrapped = self._wrapped.get(method)
        if wrapped is None:
            handler = await continuation(handler_call_details)
            if handler is None:
                return None  # no such method: not remembered (any name can be asked for)
            wrapped = self._wrapped[method] = _wrap(handler)
        return wrapped


def _wrap(handler: Any) -> Any:
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
