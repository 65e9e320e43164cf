"""E2B's network options mapped onto Stockade's network modes and egress allowlist: what
maps, and everything else refused with a reason (never silently widened or ignored)."""

from __future__ import annotations

from typing import Any

import pytest

from stockade.supervisor.config import load_config
from stockade.supervisor.fronts.e2b.network_options import network_request
from stockade.supervisor.fronts.e2b.wire import ApiError
from stockade.supervisor.models import NetworkRequest

ALL = ["0.0.0.0/0"]


def config(mode: str) -> Any:
    return load_config(None, {"sandbox.network": mode})


def refused(body: dict[str, Any], mode: str = "egress") -> str:
    with pytest.raises(ApiError) as caught:
        network_request(body, config(mode))
    assert caught.value.status == 400
    return caught.value.message


def test_what_maps() -> None:
    egress = config("egress")
    assert network_request({}, egress) is None
    assert network_request({"network": {}}, egress) is None
    assert network_request({"allow_internet_access": True}, egress) is None
    assert network_request({"allow_internet_access": False}, egress) == NetworkRequest("none")
    assert network_request({"allow_internet_access": False}, config("open")) == NetworkRequest(
        "none"
    )
    assert network_request({"network": {"denyOut": ALL}}, egress) == NetworkRequest("none")
    assert network_request({"network": {"denyOut": ["::/0", *ALL]}}, egress) == NetworkRequest(
        "none"
    )
    asked = {"network": {"denyOut": ALL, "allowOut": ["example.com", "*.pypi.org"]}}
    assert network_request(asked, egress) == NetworkRequest("egress", ("example.com", "*.pypi.org"))
    assert network_request({"network": {"allowOut": ["example.com"]}}, egress) is None
    assert network_request({"network": {"allowPublicTraffic": False}}, egress) is None
    # no internet wins over an allowlist
    both = {**asked, "allow_internet_access": False}
    assert network_request(both, egress) == NetworkRequest("none")


def test_what_is_refused() -> None:
    assert "never widen" in refused({"allow_internet_access": True}, "none")
    assert "true or false" in refused({"allow_internet_access": "yes"})
    assert "allowlist only" in refused({"network": {"denyOut": ["10.0.0.0/8"]}})
    assert "host names only" in refused({"network": {"denyOut": ALL, "allowOut": ["1.1.1.1"]}})
    assert "host names only" in refused({"network": {"denyOut": ALL, "allowOut": ["10.0.0.0/8"]}})
    assert "needs mode" in refused({"network": {"denyOut": ALL, "allowOut": ["a.com"]}}, "none")
    assert "needs mode" in refused({"network": {"denyOut": ALL, "allowOut": ["a.com"]}}, "open")
    for key in ("rules", "egressProxy", "dnsServers", "maskRequestHost", "httpsPorts"):
        assert f"network.{key}" in refused({"network": {key: ["x"]}})
    assert "no public URLs" in refused({"network": {"allowPublicTraffic": True}})
    assert "not a network option" in refused({"network": {"bogus": 1}})
    assert "must be an object" in refused({"network": ["x"]})
    assert "list of strings" in refused({"network": {"denyOut": "0.0.0.0/0"}})
    assert "list of strings" in refused({"network": {"denyOut": ALL, "allowOut": [3]}})
    assert "at most" in refused({"network": {"denyOut": ALL, "allowOut": ["a.com"] * 65}})
