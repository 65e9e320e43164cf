"""The installation CA and its certificates (supervisor/engines/backends/kubernetes/pki.py): chains
verify as a TLS peer would verify them (cryptography's RFC 5280 path validation, EKU included), each
certificate carries exactly the purpose and name designed, a non-CA is refused as a CA, and no
key ever shows in a repr."""

from __future__ import annotations

import datetime

import pytest
import trustme
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

from stockade.supervisor.engines.backends.kubernetes.pki import (
    SUPERVISOR_URI,
    Authority,
    Issued,
    agent_server_name,
    supervisor_tls,
)

SID = "0123456789abcdef"


@pytest.fixture(scope="module")
def ca() -> Authority:
    return Authority.create()


def _cert(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def _store(ca: Authority) -> Store:
    return Store([_cert(ca.cert_pem)])


def _verify_server(ca: Authority, issued: Issued, name: str) -> None:
    verifier = PolicyBuilder().store(_store(ca)).build_server_verifier(x509.DNSName(name))
    verifier.verify(_cert(issued.cert_pem), [])


def _verify_client(ca: Authority, issued: Issued) -> list[x509.GeneralName]:
    verifier = PolicyBuilder().store(_store(ca)).build_client_verifier()
    verified = verifier.verify(_cert(issued.cert_pem), [])
    assert verified.subjects is not None
    return list(verified.subjects)


def test_names() -> None:
    assert agent_server_name(SID) == f"{SID}.agent.stockade.internal"
    for bad in ("", "UPPER", "a.b", "-x", "x" * 64, "a_b"):
        with pytest.raises(ValueError, match="DNS label"):
            agent_server_name(bad)


def test_ca_is_a_ca(ca: Authority) -> None:
    cert = _cert(ca.cert_pem)
    constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical
    assert constraints.value.ca
    assert constraints.value.path_length == 0
    assert cert.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign
    key = serialization.load_pem_private_key(ca.key_pem, None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    assert key.curve.name == "secp256r1"
    assert Authority.load(ca.cert_pem, ca.key_pem) == ca


def test_agent_certificate(ca: Authority) -> None:
    issued = ca.issue_agent(SID)
    _verify_server(ca, issued, agent_server_name(SID))
    cert = _cert(issued.cert_pem)
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == [agent_server_name(SID)]
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == []
    # another sandbox's name, and use as a client, are both refused
    with pytest.raises(VerificationError):
        _verify_server(ca, issued, agent_server_name("fedcba9876543210"))
    with pytest.raises(VerificationError):
        _verify_client(ca, issued)
    key = serialization.load_pem_private_key(issued.key_pem, None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    assert key.curve.name == "secp256r1"
    assert key.public_key() == cert.public_key()


def test_supervisor_certificate(ca: Authority) -> None:
    issued = ca.issue_supervisor("supervisor-a", days=30)
    subjects = _verify_client(ca, issued)
    assert subjects == [x509.UniformResourceIdentifier(SUPERVISOR_URI)]
    cert = _cert(issued.cert_pem)
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == []
    lifetime = cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC)
    assert datetime.timedelta(days=29) < lifetime <= datetime.timedelta(days=30)
    with pytest.raises(VerificationError):  # not a server, for any name
        _verify_server(ca, issued, "supervisor-a")


def test_another_ca_does_not_verify(ca: Authority) -> None:
    other = Authority.create()
    with pytest.raises(VerificationError):
        _verify_server(ca, other.issue_agent(SID), agent_server_name(SID))
    with pytest.raises(VerificationError):
        _verify_client(ca, other.issue_supervisor())


def test_certificates_end_with_their_ca() -> None:
    short = Authority.create(days=10)
    cert = _cert(short.issue_agent(SID, days=397).cert_pem)
    assert cert.not_valid_after_utc <= _cert(short.cert_pem).not_valid_after_utc


def test_load_refuses_a_non_ca(ca: Authority) -> None:
    leaf = ca.issue_agent(SID)
    with pytest.raises(ValueError, match="not a CA certificate"):
        Authority.load(leaf.cert_pem, leaf.key_pem)
    foreign = trustme.CA()
    with pytest.raises(ValueError, match="does not belong"):
        Authority.load(foreign.cert_pem.bytes(), ca.key_pem)
    with pytest.raises(ValueError, match="not a PEM certificate"):
        Authority.load(b"nonsense", ca.key_pem)
    with pytest.raises(ValueError, match="not an unencrypted PEM private key"):
        Authority.load(ca.cert_pem, b"nonsense")


@pytest.mark.parametrize("key_type", [trustme.KeyType.ECDSA, trustme.KeyType.RSA])
def test_load_takes_another_tools_ca(key_type: trustme.KeyType) -> None:
    """An operator's CA made elsewhere (by trustme here), ECDSA or RSA, loads and issues
    certificates that verify."""
    foreign = trustme.CA(key_type=key_type)
    authority = Authority.load(foreign.cert_pem.bytes(), foreign.private_key_pem.bytes())
    _verify_server(authority, authority.issue_agent(SID), agent_server_name(SID))


def test_no_key_in_any_repr(ca: Authority) -> None:
    agent = ca.issue_agent(SID)
    client = ca.issue_supervisor()
    tls = supervisor_tls(ca, SID, client)
    for thing, key in ((ca, ca.key_pem), (agent, agent.key_pem), (client, client.key_pem)):
        text = repr(thing) + str(thing) + f"{thing!r}"
        assert "PRIVATE" not in text
        assert key.decode() not in text
        body = b"".join(key.splitlines()[1:-1]).decode()
        assert body[:40] not in text
    assert "PRIVATE" not in repr(tls)
    assert repr(agent).startswith("Issued(subject='CN=")


def test_supervisor_tls(ca: Authority) -> None:
    client = ca.issue_supervisor()
    tls = supervisor_tls(ca, SID, client)
    assert tls.ca == ca.cert_pem
    assert tls.cert_chain == client.cert_pem
    assert tls.private_key == client.key_pem
    assert tls.server_name == agent_server_name(SID)
