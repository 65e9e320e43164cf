"""E2B's network options of a create, mapped onto Stockade's network modes and egress
allowlist where they can be, refused with a reason where they cannot.

E2B filters a sandbox's outbound traffic with a deny list and an allow list that wins over
it (`network.denyOut`, `network.allowOut`: CIDRs, addresses and host names), and switches all
of it off with `allow_internet_access: false`. Stockade's sandboxes have a network mode
(`none`, `egress`: HTTP and HTTPS through a proxy to an allowlist of names, `open`) that a
request may narrow, never widen (sandboxes/network_modes.py). So:

    allow_internet_access false             mode none
    denyOut [0.0.0.0/0] (all), no allowOut  mode none
    denyOut all, allowOut [names]           mode egress, allowlist those names (each one
                                            within the configured [network] allow)
    allowOut alone                          nothing to narrow: E2B allows all then
    anything else (a deny list that is not everything, addresses or CIDRs to allow,
    rules, a SOCKS proxy, DNS servers, public traffic, host masking, HTTPS ports)
                                            refused: Stockade cannot do it as asked"""

from __future__ import annotations

from typing import Any

from stockade.supervisor.config import Config
from stockade.supervisor.fronts.e2b.wire import ApiError
from stockade.supervisor.models import NetworkRequest

ALL_TRAFFIC = frozenset({"0.0.0.0/0", "::/0"})
MAX_ALLOW = 64
_NOT_MAPPED = {
    "rules": "per-host request rules",
    "egressProxy": "a SOCKS5 egress proxy of your own",
    "dnsServers": "DNS servers to allow",
    "maskRequestHost": "host masking of the sandbox's URLs",
    "httpsPorts": "HTTPS ports of the sandbox's URLs",
}
_KNOWN = {"allowOut", "denyOut", "allowPublicTraffic", *_NOT_MAPPED}


def network_request(body: dict[str, Any], config: Config) -> NetworkRequest | None:
    """The network a create asks for (None: the configured one), or ApiError 400."""
    internet = body.get("allow_internet_access")
    if internet is not None and not isinstance(internet, bool):
        raise ApiError(400, "allow_internet_access must be true or false")
    configured = config.sandbox.network
    if internet is True and configured == "none":
        raise ApiError(
            400,
            "allow_internet_access=true: this Stockade's sandboxes have no network ([sandbox] "
            'network = "none"), and a create may narrow the network, never widen it',
        )
    wanted = _from_rules(body.get("network"), configured)
    if internet is False:
        return NetworkRequest("none")
    return wanted


def _from_rules(network: object, configured: str) -> NetworkRequest | None:
    if network is None or network == {}:
        return None
    if not isinstance(network, dict):
        raise ApiError(400, "network must be an object")
    for key, value in network.items():
        if key not in _KNOWN:
            raise ApiError(400, f"network.{key[:40]}: not a network option Stockade knows")
        if key in _NOT_MAPPED and value not in (None, [], {}, False):
            raise ApiError(400, f"network.{key}: {_NOT_MAPPED[key]} are not supported by Stockade")
    if network.get("allowPublicTraffic") is True:
        raise ApiError(
            400,
            "network.allowPublicTraffic: Stockade gives sandboxes no public URLs (no traffic "
            "comes in to them); omit it or set it false",
        )
    allow, deny = _names(network, "allowOut"), _names(network, "denyOut")
    if not deny:
        return None  # allowOut alone: E2B then allows all traffic
    if not set(deny) <= ALL_TRAFFIC:
        raise ApiError(
            400,
            "network.denyOut: Stockade filters egress by an allowlist only: deny all traffic "
            '(denyOut ["0.0.0.0/0"]) and name the hosts to allow in allowOut',
        )
    if not allow:
        return NetworkRequest("none")
    if configured != "egress":
        raise ApiError(
            400,
            f"network.allowOut: this Stockade's sandboxes have network mode {configured!r} "
            '([sandbox] network); an allowlist needs mode "egress"',
        )
    for entry in allow:
        if entry.replace(".", "").isdigit() or "/" in entry or ":" in entry:
            raise ApiError(
                400,
                f"network.allowOut: {entry[:64]!r}: Stockade's egress allows host names only "
                "(HTTP and HTTPS through its proxy), never addresses or CIDRs",
            )
    return NetworkRequest("egress", tuple(allow))


def _names(network: dict[str, Any], key: str) -> list[str]:
    value = network.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ApiError(400, f"network.{key} must be a list of strings")
    if len(value) > MAX_ALLOW:
        raise ApiError(400, f"network.{key}: at most {MAX_ALLOW} entries")
    return list(value)
