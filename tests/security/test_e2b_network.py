"""E2B's network options, attacked from inside a sandbox made through the unmodified e2b SDK
on an `egress` supervisor: `allow_out` (with all else denied) narrows the sandbox's egress to
those names, and keeps narrowing it after the container is re-created; `allow_internet_access
= False` leaves it only its loopback; names outside the configured allowlist, addresses and
deny lists that Stockade cannot express are refused at create, and nothing is made."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
from e2b import Sandbox

from tests.integration.harness import Supervisor, free_tcp_address, running_supervisor
from tests.security.test_network import PROXY, Upstream
from tests.security.test_network import upstream as upstream  # the fixture

pytestmark = pytest.mark.timeout(300)
ALL = ["0.0.0.0/0"]


@pytest.fixture(scope="module")
def served(engine: str, upstream: Upstream) -> Iterator[tuple[Supervisor, str]]:
    address = free_tcp_address()
    config = textwrap.dedent(f"""
        [e2b]
        listen = "{address}"
        [sandbox]
        network = "egress"
        [network]
        allow = ["upstream.test", "*.wild.test"]
        ports = [{upstream.http_port}]
        [network.hosts]
        "upstream.test" = "127.0.0.1"
        "a.wild.test" = "127.0.0.1"
        """)
    with running_supervisor(engine, config) as sup:
        yield sup, f"http://{address}"


def opts(url: str) -> dict[str, Any]:
    return {"api_url": url, "sandbox_url": url, "api_key": "any", "timeout": 120}


def status(sbx: Sandbox, url: str) -> str:
    command = (
        f"curl -sS --max-time 20 -x {PROXY} --noproxy '' -o /dev/null -w '%{{http_code}}' {url}"
    )
    return sbx.commands.run(command + " || true").stdout.strip()


def interfaces(sbx: Sandbox) -> list[str]:
    return sbx.commands.run("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '").stdout.split()


def test_allow_out_narrows_egress_for_good(
    served: tuple[Supervisor, str], upstream: Upstream
) -> None:
    sup, url = served
    sbx = Sandbox.create(network={"deny_out": ALL, "allow_out": ["a.wild.test"]}, **opts(url))
    try:
        allowed = f"http://a.wild.test:{upstream.http_port}/"
        other = f"http://upstream.test:{upstream.http_port}/"
        assert status(sbx, allowed) == "200"
        assert status(sbx, other) == "403"
        with sup.client() as client:
            key = f"e2b-{sbx.sandbox_id}"
            info = client.get_sandbox(key)
            assert (info.network_mode, info.network_allow) == ("egress", ("a.wild.test",))
            first = info.container_id
            client.destroy_sandbox(key, delete_workspace=False)  # as a prune would
        assert status(sbx, other) == "403"  # a new container, the same narrowed network
        assert status(sbx, allowed) == "200"
        with sup.client() as client:
            assert client.get_sandbox(key).container_id != first
    finally:
        sbx.kill()


def test_no_internet_is_only_loopback(served: tuple[Supervisor, str], upstream: Upstream) -> None:
    _, url = served
    for network in ({"allow_internet_access": False}, {"network": {"deny_out": ALL}}):
        sbx = Sandbox.create(**network, **opts(url))
        try:
            assert interfaces(sbx) == ["lo"], network
            assert status(sbx, f"http://upstream.test:{upstream.http_port}/") != "200"
        finally:
            sbx.kill()


def test_what_cannot_be_narrowed_is_refused(served: tuple[Supervisor, str]) -> None:
    sup, url = served
    with sup.client() as client:
        before = {s.key for s in client.list_sandboxes()}
    for network, says in [
        ({"deny_out": ALL, "allow_out": ["evil.test"]}, "not within the configured allowlist"),
        ({"deny_out": ALL, "allow_out": ["*.test"]}, "not within the configured allowlist"),
        ({"deny_out": ALL, "allow_out": ["127.0.0.1"]}, "host names only"),
        ({"deny_out": ["10.0.0.0/8"]}, "allowlist only"),
        ({"deny_out": ALL, "allow_out": ["a.wild.test"], "dns_servers": ["1.1.1.1"]}, "DNS"),
    ]:
        with pytest.raises(Exception, match=says):
            Sandbox.create(network=network, **opts(url))
    with sup.client() as client:
        assert {s.key for s in client.list_sandboxes()} == before
