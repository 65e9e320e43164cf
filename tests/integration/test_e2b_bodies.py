"""Hostile bodies at the E2B front of a real `stockade serve`, both engines (issue 26): a gzip
bomb (one, then six at once), truncated and invalid gzip, deflate, br, a 60 MB envd Start
envelope, a 300 MB multipart part and JSON nested 100,000 deep, each sent raw to the port.
Each is refused clearly (or, for deflate and the big part, taken whole), the server stays
healthy, its memory comes back within 50 MB, the file an upload would have replaced is
intact, no `.stockade-upload-*` is left in the workspace and no file was spooled on the host."""

from __future__ import annotations

import gzip
import os
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox

from bench import hostile
from bench.hostile import CONNECT_JSON, DEEP_JSON, MiB, bomb, envd_client, start_envelope
from stockade.supervisor.observe.refusals import BODY_TOOL
from tests.integration.e2b_kit import E2bServed
from tests.integration.harness import refused_rows

pytestmark = pytest.mark.timeout(600)
ORIGINAL = os.urandom(100 << 10)
TARGET = "/home/user/kept.bin"


@pytest.fixture(scope="module")
def sbx(served: E2bServed) -> Iterator[Sandbox]:
    box = Sandbox.create(timeout=600, **served.opts())
    try:
        box.files.write(TARGET, ORIGINAL)
        yield box
    finally:
        box.kill()


def envd(served: E2bServed, box: Sandbox) -> httpx.Client:
    return envd_client(served.url, box)


def upload(client: httpx.Client, body: bytes, encoding: str) -> httpx.Response:
    return hostile.upload(client, TARGET, body, encoding)


def spooled(pid: int) -> list[str]:
    """The supervisor's open files outside its state and the engines' sockets: a spooled body
    would be one (a deleted file in the temp dir)."""
    found = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("/tmp/") and ("(deleted)" in target or "/tmp/tmp" in target):
            found.append(target)
    return found


def assert_unharmed(served: E2bServed, box: Sandbox, rss_start: int) -> None:
    with envd(served, box) as client:
        assert client.get("/health").status_code == 204
    assert bytes(box.files.read(TARGET, format="bytes")) == ORIGINAL
    leftovers = [e.name for e in box.files.list("/home/user") if ".stockade-upload-" in e.name]
    assert leftovers == []
    assert served.sup.rss_bytes() < rss_start + 50 * MiB


def rss_now(served: E2bServed) -> int:
    return served.sup.rss_bytes()


def test_a_gzip_bomb_is_refused_and_six_at_once_too(served: E2bServed, sbx: Sandbox) -> None:
    start = rss_now(served)
    data = bomb()
    with envd(served, sbx) as client:
        r = upload(client, data, "gzip")
    assert r.status_code == 413
    assert "100-fold" in r.json()["message"]
    assert_unharmed(served, sbx, start)
    with ThreadPoolExecutor(6) as pool:

        def one(_: int) -> tuple[int, str]:
            with envd(served, sbx) as client:
                answer = upload(client, data, "gzip")
                return answer.status_code, answer.text[:300]

        answers = list(pool.map(one, range(6)))
        assert [status for status, _ in answers] == [413] * 6, answers
    assert_unharmed(served, sbx, start)


def test_truncated_and_invalid_gzip_never_replace_the_file(served: E2bServed, sbx: Sandbox) -> None:
    start = rss_now(served)
    whole = gzip.compress(os.urandom(200 << 10))
    with envd(served, sbx) as client:
        r = upload(client, whole[: len(whole) // 3], "gzip")
        assert (r.status_code, "truncated" in r.json()["message"]) == (400, True)
        r = upload(client, b"not gzip at all" * 100, "gzip")
        assert (r.status_code, "not valid gzip" in r.json()["message"]) == (400, True)
        r = upload(client, whole + b"trailing", "gzip")
        assert r.status_code == 400
    assert_unharmed(served, sbx, start)


def test_deflate_is_decoded_and_br_is_refused_by_name(served: E2bServed, sbx: Sandbox) -> None:
    data = os.urandom(64 << 10) * 4
    with envd(served, sbx) as client:
        for body in (zlib.compress(data), zlib.compress(data)[2:-4]):  # zlib-wrapped, raw
            headers = {"content-type": "application/octet-stream", "content-encoding": "deflate"}
            r = client.post("/files", params={"path": "d.bin"}, content=body, headers=headers)
            assert r.status_code == 200, r.text
            assert bytes(sbx.files.read("d.bin", format="bytes")) == data
        r = upload(client, b"\x0b\x02\x80hello\x03", "br")
        assert (r.status_code, "'br'" in r.json()["message"]) == (415, True)
    assert_unharmed(served, sbx, rss_now(served))


def test_an_oversized_start_envelope_is_refused(served: E2bServed, sbx: Sandbox) -> None:
    start = rss_now(served)
    with envd(served, sbx) as client:
        r = client.post("/process.Process/Start", content=start_envelope(), headers=CONNECT_JSON)
    assert r.status_code == 200  # Connect streams answer errors in their end-of-stream
    assert b"resource_exhausted" in r.content
    assert_unharmed(served, sbx, start)


def test_nested_json_is_400_everywhere(served: E2bServed, sbx: Sandbox) -> None:
    deep = DEEP_JSON
    with envd(served, sbx) as client:
        r = client.post(
            "/filesystem.Filesystem/Stat",
            content=deep,
            headers={"content-type": "application/json"},
        )
        assert (r.status_code, r.json()["code"]) == (400, "invalid_argument")
    r = httpx.post(
        f"{served.url}/sandboxes", content=deep, headers={"X-API-KEY": served.token}, timeout=60
    )
    assert (r.status_code, "nested" in r.json()["message"]) == (400, True)
    assert_unharmed(served, sbx, rss_now(served))


def test_a_300mb_multipart_part_streams_to_the_sandbox(served: E2bServed, sbx: Sandbox) -> None:
    start = rss_now(served)
    pid = served.sup.process.pid if served.sup.process else 0
    seen: list[str] = []
    block = os.urandom(MiB)

    def body() -> Iterator[bytes]:
        yield b'--b0und\r\nContent-Disposition: form-data; name="file"; filename="big.bin"\r\n\r\n'
        for i in range(300):
            if i == 200:
                seen.extend(spooled(pid))
            yield block
        yield b"\r\n--b0und--\r\n"

    headers = {"content-type": "multipart/form-data; boundary=b0und"}
    with envd(served, sbx) as client:
        r = client.post("/files", content=body(), headers=headers)
    assert r.status_code == 200, r.text
    assert seen == []
    sizes = {e.name: e.size for e in sbx.files.list("/home/user")}
    assert sizes["big.bin"] == 300 * MiB
    sbx.files.remove("/home/user/big.bin")
    assert_unharmed(served, sbx, start)


def test_a_multipart_part_cut_short_leaves_the_file(served: E2bServed, sbx: Sandbox) -> None:
    start = rss_now(served)

    def body() -> Iterator[bytes]:
        yield b'--b0und\r\nContent-Disposition: form-data; name="file"; filename="kept.bin"\r\n\r\n'
        yield os.urandom(300 << 10)
        yield b"\r\n--b0und"  # no closing "--"; then the body simply ends

    headers = {"content-type": "multipart/form-data; boundary=b0und"}
    with envd(served, sbx) as client:
        r = client.post("/files", params={"path": TARGET}, content=body(), headers=headers)
        assert r.status_code == 400
        r = client.post(
            "/files",
            params={"path": TARGET},
            content=b'--b0und\r\nContent-Disposition: form-data; name="file"; filename="x"\r\n\r\n'
            + b"partial",
            headers=headers,
        )
        assert (r.status_code, "truncated" in r.json()["message"]) == (400, True)
    assert_unharmed(served, sbx, start)


def test_every_refused_body_is_audited_without_its_bytes(served: E2bServed, sbx: Sandbox) -> None:
    """The module's refusals above (and one more here) are in the audit log as `receive_body`
    records of the e2b front, bounded per client address and window, never a byte of a body."""
    marker = b"MARKER-" + os.urandom(8).hex().encode()
    with envd(served, sbx) as client:
        assert upload(client, marker * 100, "gzip").status_code == 400
    with served.sup.client(token=served.token) as c:
        c.list_audit(limit=1)  # the audit log written up to now
    rows = refused_rows(served.sup, BODY_TOOL, "e2b")
    assert rows, "no refused body audited"
    assert all(caller in ("127.0.0.1", "::1") for caller, _, _ in rows)
    assert len(rows) <= 20  # one per window of 60 s, plus its count: bounded, not one per body
    assert any("body refused (413)" in step for _, step, _ in rows)
    assert not any(marker.decode() in step + args for _, step, args in rows)
