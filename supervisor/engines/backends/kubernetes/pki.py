"""The installation's certificate authority and the certificates it issues.

A sandbox pod's agent is reached over the pod network, so both ends prove who they are with
certificates of one CA, which the installation keeps in a Secret (kubernetes.ca_secret):

- each sandbox's agent gets a server certificate (serverAuth only) for a fixed name derived
  from its sandbox id, `agent_server_name()`: the supervisor checks that name, not the pod IP
  it dials (a pod's IP changes with every pod, and another pod may hold an old one);
- each supervisor gets a short-lived client certificate (clientAuth only) carrying the SAN URI
  SUPERVISOR_URI, which the agent requires of every call. A sandbox's own agent certificate
  (readable by the code in that sandbox) has neither the EKU nor the URI, so it cannot be
  used to talk to another sandbox's agent.

Keys are ECDSA P-256. No key ever appears in a repr or a log line.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from stockade.agent.tls import SUPERVISOR_URI
from stockade.supervisor.engines.addresses import MutualTls

__all__ = ["SUPERVISOR_URI", "Authority", "Issued", "agent_server_name", "supervisor_tls"]
AGENT_DOMAIN = "agent.stockade.internal"
CLOCK_SKEW = datetime.timedelta(minutes=5)
"""Certificates are valid from a little before they are made: nodes' clocks differ."""
_DNS_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")


def agent_server_name(sandbox_id: str) -> str:
    """The name a sandbox's agent certificate is issued for and the supervisor checks."""
    if not _DNS_LABEL.fullmatch(sandbox_id):
        raise ValueError(
            f"a sandbox id must be a DNS label (a-z, 0-9, '-'; at most 63) to name its agent, "
            f"got {sandbox_id!r}"
        )
    return f"{sandbox_id}.{AGENT_DOMAIN}"


@dataclass(frozen=True, repr=False)
class Issued:
    """A certificate and its private key, both PEM."""

    cert_pem: bytes
    key_pem: bytes

    def __repr__(self) -> str:  # never the key
        try:
            cert = x509.load_pem_x509_certificate(self.cert_pem)
            subject = cert.subject.rfc4514_string()
            until = cert.not_valid_after_utc.isoformat()
        except ValueError:
            return "Issued(<not a certificate>)"
        return f"Issued(subject={subject!r}, not_after={until!r})"


@dataclass(frozen=True, repr=False)
class Authority:
    """The CA: its certificate and its key (PEM). Make one with create(), read one with
    load()."""

    cert_pem: bytes
    key_pem: bytes

    @classmethod
    def create(cls, common_name: str = "stockade agent CA", days: int = 3650) -> Authority:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        now = _now()
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - CLOCK_SKEW)
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_usage(cert_sign=True), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .sign(key, hashes.SHA256())
        )
        return cls(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))

    @classmethod
    def load(cls, cert_pem: bytes, key_pem: bytes) -> Authority:
        """The CA kept in the installation's Secret (tls.crt, tls.key). ValueError, in words
        an operator can act on, when it is not a usable CA."""
        try:
            cert = x509.load_pem_x509_certificate(cert_pem)
        except ValueError as exc:
            raise ValueError(f"the CA certificate is not a PEM certificate: {exc}") from None
        try:
            key = serialization.load_pem_private_key(key_pem, password=None)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"the CA key is not an unencrypted PEM private key: {exc}") from None
        if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
            raise ValueError("the CA key must be an ECDSA or RSA key")
        try:
            constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
        except x509.ExtensionNotFound:
            constraints = None
        if constraints is None or not constraints.ca:
            raise ValueError(
                f"the certificate {cert.subject.rfc4514_string()!r} is not a CA certificate "
                "(no basicConstraints CA:TRUE)"
            )
        try:
            usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
        except x509.ExtensionNotFound:
            usage = None
        if usage is not None and not usage.key_cert_sign:
            raise ValueError("the CA certificate's key usage does not allow signing certificates")
        if key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        ) != cert.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        ):
            raise ValueError("the CA key does not belong to the CA certificate")
        if cert.not_valid_after_utc <= _now():
            raise ValueError(f"the CA certificate expired on {cert.not_valid_after_utc:%Y-%m-%d}")
        return cls(cert_pem, key_pem)

    def issue_agent(self, sandbox_id: str, days: int = 397) -> Issued:
        """A sandbox agent's server certificate: serverAuth only, for agent_server_name()."""
        name = agent_server_name(sandbox_id)
        return self._issue(
            name,
            x509.SubjectAlternativeName([x509.DNSName(name)]),
            ExtendedKeyUsageOID.SERVER_AUTH,
            days,
        )

    def issue_supervisor(self, name: str = "supervisor", days: int = 30) -> Issued:
        """A supervisor's client certificate: clientAuth only, SAN URI SUPERVISOR_URI."""
        return self._issue(
            name,
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(SUPERVISOR_URI)]),
            ExtendedKeyUsageOID.CLIENT_AUTH,
            days,
        )

    def _issue(
        self,
        common_name: str,
        san: x509.SubjectAlternativeName,
        purpose: x509.ObjectIdentifier,
        days: int,
    ) -> Issued:
        ca_cert = x509.load_pem_x509_certificate(self.cert_pem)
        ca_key = serialization.load_pem_private_key(self.key_pem, password=None)
        if not isinstance(ca_key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
            raise ValueError("the CA key must be an ECDSA or RSA key")
        key = ec.generate_private_key(ec.SECP256R1())
        now = _now()
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - CLOCK_SKEW)
            .not_valid_after(min(now + datetime.timedelta(days=days), ca_cert.not_valid_after_utc))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_usage(cert_sign=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([purpose]), critical=False)
            .add_extension(san, critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),  # type: ignore[arg-type]
                critical=False,
            )
            .sign(ca_key, hashes.SHA256())
        )
        return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))

    def __repr__(self) -> str:  # never the key
        try:
            subject = x509.load_pem_x509_certificate(self.cert_pem).subject.rfc4514_string()
        except ValueError:
            return "Authority(<not a certificate>)"
        return f"Authority(subject={subject!r})"


def supervisor_tls(authority: Authority, sandbox_id: str, client: Issued) -> MutualTls:
    """What a supervisor dials sandbox `sandbox_id`'s agent with: the CA's certificate to check
    the agent's against, the agent's fixed name, and the supervisor's own certificate."""
    return MutualTls(
        ca=authority.cert_pem,
        cert_chain=client.cert_pem,
        private_key=client.key_pem,
        server_name=agent_server_name(sandbox_id),
    )


def _usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)
