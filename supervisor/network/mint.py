"""The installation's egress CA: the certificate authority sandboxes trust so the egress proxy
can terminate TLS for hosts that have brokered secrets (it puts the real secret in requests
the sandbox sends with a placeholder). One per installation, kept in the supervisor's state
directory (egress-ca/ca.crt, ca.key 0600) so a restarted supervisor serves sandboxes that
already trust it. Leaf certificates are minted on first use per host name, short-lived
(a sandbox never holds one: only the CA certificate), and cached in memory."""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import ssl
import tempfile
import threading
import time
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

log = logging.getLogger("stockade.egress")
CA_NAME = "Stockade egress CA"
CA_DAYS = 3650
LEAF_LIFETIME = datetime.timedelta(days=2)
LEAF_RENEW_S = 24 * 3600.0
"""A cached leaf older than this is minted again (it stays valid a day more)."""
MAX_LEAVES = 1024
"""Cached leaf contexts; the oldest go first (a sandbox reaches few hosts)."""


class AuthorityError(Exception):
    """The CA files cannot be read or written; the message says which and why."""


class Authority:
    def __init__(self, certificate: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
        self._certificate = certificate
        self._key = key
        self._contexts: dict[str, tuple[float, ssl.SSLContext]] = {}
        self._lock = threading.Lock()
        self.certificate_pem = certificate.public_bytes(serialization.Encoding.PEM)
        """What sandboxes trust (added to their CA bundle)."""

    @classmethod
    def load_or_create(cls, directory: Path) -> Authority:
        """The CA in `directory` (ca.crt, ca.key), made there first when absent."""
        cert_path, key_path = directory / "ca.crt", directory / "ca.key"
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            if cert_path.exists() and key_path.exists():
                if key_path.stat().st_mode & 0o077:
                    log.warning("egress CA key %s was readable by others: now 0600", key_path)
                    key_path.chmod(0o600)
                return cls._load(cert_path.read_bytes(), key_path.read_bytes(), directory)
            if cert_path.exists() or key_path.exists():
                raise AuthorityError(
                    f"egress CA in {directory}: one of ca.crt and ca.key is missing; remove the "
                    "other to make a new CA (sandboxes then need re-creating to trust it)"
                )
            authority = cls._create()
            key_pem = authority._key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
            _write_private(key_path, key_pem)
            _write_private(cert_path, authority.certificate_pem, mode=0o644)
            return authority
        except OSError as exc:
            raise AuthorityError(f"egress CA in {directory}: {exc.strerror or exc}") from exc

    @classmethod
    def _load(cls, cert_pem: bytes, key_pem: bytes, directory: Path) -> Authority:
        try:
            certificate = x509.load_pem_x509_certificate(cert_pem)
            key = serialization.load_pem_private_key(key_pem, password=None)
        except ValueError as exc:
            raise AuthorityError(f"egress CA in {directory} is not readable PEM: {exc}") from exc
        public = certificate.public_key()
        if (
            not isinstance(key, ec.EllipticCurvePrivateKey)
            or not isinstance(public, ec.EllipticCurvePublicKey)
            or key.public_key().public_numbers() != public.public_numbers()
        ):
            raise AuthorityError(
                f"egress CA in {directory}: ca.key is not the key of ca.crt (or not ECDSA)"
            )
        return cls(certificate, key)

    @classmethod
    def _create(cls) -> Authority:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        name = x509.Name(
            [
                x509.NameAttribute(NameOID.COMMON_NAME, CA_NAME),
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Stockade"),
            ]
        )
        certificate = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_usage(ca=True), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .sign(key, hashes.SHA256())
        )
        return cls(certificate, key)

    def context_for(self, host: str) -> ssl.SSLContext:
        """A server-side TLS context presenting a leaf for `host` (a canonical name), minted
        on first use and cached; HTTP/1.1 only (ALPN), TLS 1.2 at least."""
        now = time.monotonic()
        with self._lock:
            cached = self._contexts.get(host)
            if cached is not None and now - cached[0] < LEAF_RENEW_S:
                return cached[1]
            context = self._mint(host)
            if len(self._contexts) >= MAX_LEAVES:
                self._contexts.pop(next(iter(self._contexts)))
            self._contexts[host] = (now, context)
            return context

    def leaf_pem(self, host: str) -> tuple[bytes, bytes]:
        """A freshly minted leaf certificate and its key (PEM) for `host`."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        certificate = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host[:64])]))
            .issuer_name(self._certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + LEAF_LIFETIME)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_usage(ca=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), False
            )
            .sign(self._key, hashes.SHA256())
        )
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        return certificate.public_bytes(serialization.Encoding.PEM), key_pem

    def _mint(self, host: str) -> ssl.SSLContext:
        cert_pem, key_pem = self.leaf_pem(host)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_alpn_protocols(["http/1.1"])
        # load_cert_chain reads files only: a private temporary file, gone once loaded
        fd, path = tempfile.mkstemp(prefix="stockade-leaf-", suffix=".pem")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(key_pem + cert_pem)
            context.load_cert_chain(path)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)
        return context


def _usage(ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not ca, content_commitment=False, key_encipherment=False,
        data_encipherment=False, key_agreement=False, key_cert_sign=ca, crl_sign=ca,
        encipher_only=False, decipher_only=False,
    )  # fmt: skip


def _write_private(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Written whole under a temporary name, then renamed (never a half-written key)."""
    partial = path.with_name(path.name + ".partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.chmod(partial, mode)
    os.replace(partial, path)
