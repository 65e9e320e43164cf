"""The installation's egress CA (network/mint.py): made once, kept 0600, loaded again by a
restarted supervisor; leaves a real TLS client accepts for their host only."""

from __future__ import annotations

import asyncio
import ssl
import stat
from pathlib import Path

import pytest
from cryptography import x509

from stockade.supervisor.network.mint import Authority, AuthorityError


def test_created_once_and_loaded_again(tmp_path: Path) -> None:
    folder = tmp_path / "state" / "egress-ca"
    first = Authority.load_or_create(folder)
    assert stat.S_IMODE((folder / "ca.key").stat().st_mode) == 0o600
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    again = Authority.load_or_create(folder)
    assert again.certificate_pem == first.certificate_pem == (folder / "ca.crt").read_bytes()
    ca = x509.load_pem_x509_certificate(first.certificate_pem)
    constraints = ca.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert constraints.ca
    assert constraints.path_length == 0
    assert b"PRIVATE" not in first.certificate_pem


def test_loose_key_permissions_are_tightened(tmp_path: Path) -> None:
    Authority.load_or_create(tmp_path)
    (tmp_path / "ca.key").chmod(0o644)
    Authority.load_or_create(tmp_path)
    assert stat.S_IMODE((tmp_path / "ca.key").stat().st_mode) == 0o600


@pytest.mark.parametrize(
    ("crt", "key", "message"),
    [
        (None, b"k", "one of ca.crt and ca.key is missing"),
        (b"garbage", b"garbage", "not readable PEM"),
        ("other", "own", "is not the key of ca.crt"),
    ],
)
def test_broken_ca_files_are_refused_plainly(
    tmp_path: Path, crt: bytes | str | None, key: bytes | str, message: str
) -> None:
    other = tmp_path / "other"
    Authority.load_or_create(other)
    own = tmp_path / "ca"
    own.mkdir()
    if crt is not None:
        (own / "ca.crt").write_bytes(
            (other / "ca.crt").read_bytes() if crt == "other" else crt  # type: ignore[arg-type]
        )
    if key == "own":
        Authority.load_or_create(tmp_path / "third")
        (own / "ca.key").write_bytes((tmp_path / "third" / "ca.key").read_bytes())
    else:
        (own / "ca.key").write_bytes(key)  # type: ignore[arg-type]
    with pytest.raises(AuthorityError, match=message):
        Authority.load_or_create(own)


def test_unwritable_directory_is_a_plain_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(AuthorityError, match="egress CA in"):
        Authority.load_or_create(tmp_path / "file" / "ca")


def test_leaf_is_short_lived_for_its_host_only(tmp_path: Path) -> None:
    authority = Authority.load_or_create(tmp_path)
    cert_pem, _ = authority.leaf_pem("api.test")
    leaf = x509.load_pem_x509_certificate(cert_pem)
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["api.test"]
    assert (leaf.not_valid_after_utc - leaf.not_valid_before_utc).days <= 3
    assert authority.context_for("api.test") is authority.context_for("api.test")
    assert authority.context_for("other.test") is not authority.context_for("api.test")


async def handshake(authority: Authority, ca_file: Path, served: str, asked: str) -> str:
    """A real TLS handshake on loopback: the server presents the leaf for `served`, the
    client verifies for `asked` against the CA; the ALPN protocol agreed."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"ok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=authority.context_for(served))
    port = server.sockets[0].getsockname()[1]
    client = ssl.create_default_context(cafile=str(ca_file))
    client.set_alpn_protocols(["h2", "http/1.1"])
    try:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client, server_hostname=asked
        )
        assert await reader.read() == b"ok"
        protocol = writer.get_extra_info("ssl_object").selected_alpn_protocol()
        writer.close()
        return str(protocol)
    finally:
        server.close()
        await server.wait_closed()


async def test_a_real_client_trusts_the_leaf_for_its_host_only(tmp_path: Path) -> None:
    authority = Authority.load_or_create(tmp_path)
    assert await handshake(authority, tmp_path / "ca.crt", "api.test", "api.test") == "http/1.1"
    with pytest.raises(ssl.SSLCertVerificationError, match="match"):
        await handshake(authority, tmp_path / "ca.crt", "api.test", "evil.test")
    stranger = Authority.load_or_create(tmp_path / "stranger")
    with pytest.raises(ssl.SSLCertVerificationError):
        await handshake(stranger, tmp_path / "ca.crt", "api.test", "api.test")
