"""Brokered secrets as a sandbox gets them: placeholders derived per sandbox and secret under
the installation's key (stable across restarts, different everywhere else), the secrets a
key's tenant and profile get, the Broker of its proxy, and the trust bundle and variables of
its container; never the real value in any of what the sandbox sees."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import stat
from pathlib import Path

import pytest

from stockade.supervisor.app import build_policy, injection_recorder
from stockade.supervisor.config import Config
from stockade.supervisor.config.loading import load_config
from stockade.supervisor.errors import ConfigError
from stockade.supervisor.keys import scope
from stockade.supervisor.models import NetworkRequest
from stockade.supervisor.network.brokered import Broker, Injected
from stockade.supervisor.observe.audit import AuditQuery
from stockade.supervisor.sandboxes import brokering
from stockade.supervisor.sandboxes.brokering import Brokering, installation_key, placeholder
from stockade.supervisor.sandboxes.containers import Containers
from stockade.supervisor.sandboxes.layout import Layout
from stockade.supervisor.sandboxes.network_modes import Networks
from stockade.supervisor.sandboxes.profiles import Profiles
from tests.unit.fakes import FakeAgent, FakeBackend

VALUE = "ghp_RealSecretValue0123456789abcdefXYZ"
CA = b"-----BEGIN CERTIFICATE-----\nTESTCA\n-----END CERTIFICATE-----\n"


def config(tmp_path: Path, extra: str = "") -> Config:
    token = tmp_path / "token"
    token.write_text(VALUE + "\n")
    token.chmod(0o600)
    path = tmp_path / "stockade.toml"
    path.write_text(
        f'state_dir = "{tmp_path / "state"}"\n'
        '[sandbox]\nnetwork = "egress"\n[profiles.big]\nmemory_mb = 1024\n'
        f'[secrets.github]\nfile = "{token}"\nhosts = ["api.github.com"]\n'
        'template = "Bearer {secret}"\nsandbox_env = "GITHUB_TOKEN"\n'
        f'[secrets.git]\nfile = "{token}"\nhosts = ["*.example.com"]\n'
        'basic_user = "x-access-token"\nsandbox_env = "GIT_TOKEN"\n'
        'tenants = ["team-a"]\nprofiles = ["big"]\n' + extra
    )
    return load_config(path)


def test_placeholders_are_stable_and_distinct() -> None:
    key = b"k" * 32
    first = placeholder(key, "sid1", "github")
    assert re.fullmatch(r"stk_ph_[a-z2-7]{32}", first)
    assert placeholder(key, "sid1", "github") == first
    others = {
        placeholder(key, "sid2", "github"),
        placeholder(key, "sid1", "git"),
        placeholder(b"j" * 32, "sid1", "github"),
        placeholder(key, "sid1\0git", "hub"),
    }
    assert first not in others
    assert len(others) == 4


def test_the_installation_key_is_made_once_and_private(tmp_path: Path) -> None:
    state = tmp_path / "state"
    key = installation_key(state)
    assert len(key) == 32
    assert stat.S_IMODE((state / brokering.KEY_FILE).stat().st_mode) == 0o600
    assert installation_key(state) == key
    (state / brokering.KEY_FILE).chmod(0o644)
    assert installation_key(state) == key
    assert stat.S_IMODE((state / brokering.KEY_FILE).stat().st_mode) == 0o600


def test_a_damaged_or_linked_key_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / brokering.KEY_FILE).write_bytes(b"short")
    with pytest.raises(ConfigError, match="not a placeholder key"):
        installation_key(state)
    (state / brokering.KEY_FILE).unlink()
    (tmp_path / "elsewhere").write_bytes(b"x" * 32)
    (state / brokering.KEY_FILE).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match="cannot read the placeholder key"):
        installation_key(state)


def test_which_sandboxes_get_which_secrets(tmp_path: Path) -> None:
    broker = Brokering(config(tmp_path), lambda: CA)
    names = lambda key, profile: [n for n, _ in broker.applying(key, profile)]  # noqa: E731
    assert names("plain", "") == ["github"]
    assert names(scope("team-a", "k"), "") == ["github"]
    assert names(scope("team-a", "k"), "big") == ["github", "git"]
    assert names(scope("team-b", "k"), "big") == ["github"]
    assert names("plain", "big") == ["github"]


def test_the_broker_of_a_sandbox(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    brokering_ = Brokering(cfg, lambda: CA)
    broker = brokering_.broker(scope("team-a", "k"), "abc", "big")
    ikey = installation_key(tmp_path / "state")
    github, git = broker.secrets
    assert github.value == VALUE
    assert github.placeholder == placeholder(ikey, "abc", "github")
    assert (github.injection.kind, github.injection.header) == ("header", "Authorization")
    assert github.injection.template == "Bearer {secret}"
    assert (git.injection.kind, git.injection.username) == ("basic", "x-access-token")
    assert broker.intercepts("api.github.com")
    assert broker.intercepts("git.example.com")
    assert not broker.intercepts("example.com")
    assert not broker.intercepts("api.github.com.evil.test")
    assert VALUE not in repr(broker)
    assert brokering_.broker("k", "abc", "").secrets[0].placeholder == github.placeholder


def test_intercept_all_terminates_every_host_of_a_sandbox_with_secrets(tmp_path: Path) -> None:
    """[network] intercept = "all": a sandbox that holds placeholders has every TLS
    connection terminated (a placeholder is then seen whatever allowed host it goes to); a
    sandbox with no secret keeps its tunnels; "brokered" (the default) only its hosts'."""
    default = Brokering(config(tmp_path), lambda: CA)
    assert not default.broker("k", "abc", "").intercepts("pypi.org")
    every = Brokering(config(tmp_path, '[network]\nintercept = "all"\n'), lambda: CA)
    broker = every.broker("k", "abc", "")
    assert broker.intercepts("pypi.org")
    assert broker.intercepts("api.github.com")
    assert not Broker((), everything=True).intercepts("pypi.org")  # no secret: tunnels
    for wrong in ("ALL", "none", "", "all " * 50):
        with pytest.raises(ConfigError, match=r"network\.intercept must be one of brokered, all"):
            config(tmp_path, f'[network]\nintercept = "{wrong}"\n')


def test_a_container_gets_placeholders_and_the_trust_bundle(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    folder = tmp_path / "sandbox"
    folder.mkdir(mode=0o700)
    parts = Brokering(cfg, lambda: CA).container_parts(
        scope("team-a", "k"), "abc", "big", "egress", folder
    )
    ikey = installation_key(tmp_path / "state")
    env = parts.environment
    assert env["GITHUB_TOKEN"] == placeholder(ikey, "abc", "github")
    assert env["GIT_TOKEN"] == placeholder(ikey, "abc", "git")
    for name in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO"):
        assert env[name] == brokering.SANDBOX_BUNDLE
    assert env["NODE_EXTRA_CA_CERTS"] == brokering.SANDBOX_CA
    assert VALUE not in repr(parts)
    mounts = {m.target: m for m in parts.mounts}
    assert set(mounts) == {brokering.SANDBOX_BUNDLE, brokering.SANDBOX_CA}
    assert all(m.read_only for m in parts.mounts)
    bundle = Path(mounts[brokering.SANDBOX_BUNDLE].source).read_bytes()
    assert bundle.endswith(CA)
    assert b"BEGIN CERTIFICATE" in bundle[: -len(CA)]  # the host's own CAs come first
    assert Path(mounts[brokering.SANDBOX_CA].source).read_bytes() == CA
    for m in parts.mounts:
        assert Path(m.source).parent == folder / brokering.TRUST_FOLDER
        assert stat.S_IMODE(Path(m.source).stat().st_mode) == 0o644
        assert VALUE.encode() not in Path(m.source).read_bytes()


def test_no_secret_no_parts_and_another_network_is_told_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    broker = Brokering(config(tmp_path), lambda: CA)
    folder = tmp_path / "sandbox"
    folder.mkdir()
    assert broker.container_parts("", "", "", "egress", folder).environment == {}
    caplog.set_level(logging.WARNING, "stockade")
    for _ in range(3):
        parts = broker.container_parts("k", "abc", "", "none", folder)
        assert parts.environment == {}
        assert parts.mounts == ()
    told = [r for r in caplog.records if "no brokered secrets" in r.getMessage()]
    assert len(told) == 1
    assert "github" in told[0].getMessage()
    assert not (folder / brokering.TRUST_FOLDER).exists()


def test_a_hostile_trust_folder_is_not_followed(tmp_path: Path) -> None:
    broker = Brokering(config(tmp_path), lambda: CA)
    folder = tmp_path / "sandbox"
    (folder / brokering.TRUST_FOLDER).mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (folder / brokering.TRUST_FOLDER / brokering.BUNDLE).symlink_to(victim)
    (folder / brokering.TRUST_FOLDER / (brokering.CA_ALONE + ".partial")).symlink_to(victim)
    broker.container_parts("k", "abc", "", "egress", folder)
    assert victim.read_text() == "keep"
    assert not (folder / brokering.TRUST_FOLDER / brokering.BUNDLE).is_symlink()


def test_real_values_are_scrubbed_and_injections_audited_without_them(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    policy = build_policy(cfg)
    assert policy.scrubber is not None
    shown, count = policy.scrubber.scrub(f"token: {VALUE}\n")
    assert VALUE not in shown
    assert count == 1
    assert policy.audit is not None
    record = injection_recorder(policy)
    key = scope("team-a", "k")
    record(Injected(key, "github", "api.github.com", "POST", "/repos/x/issues?" + "q" * 5000))
    policy.audit.flush()
    got = asyncio.run(
        policy.audit.query(AuditQuery(tenant="team-a", sandbox_key="k", tool="network"))
    )
    assert len(got) == 1
    assert got[0].policy_step == "egress: injected github"
    assert not got[0].is_error
    target = json.loads(got[0].arguments_json)
    assert (target["secret"], target["host"], target["method"]) == (
        "github", "api.github.com", "POST",
    )  # fmt: skip
    assert len(target["path"]) == 2048
    assert VALUE not in got[0].arguments_json
    policy.audit.close()


def test_the_container_spec_carries_placeholders_trust_and_the_node_preload(
    tmp_path: Path,
) -> None:
    cfg = config(tmp_path)
    networks = Networks(cfg, "0123456789abcdef")
    backend = FakeBackend()
    containers = Containers(
        cfg, backend, Layout(cfg), networks, lambda address: FakeAgent(backend, address),
        instance_id="0123456789abcdef", image="img", owner_label=lambda: "owner",
    )  # fmt: skip
    layout = Layout(cfg)
    key = scope("team-a", "k")
    paths = layout.of(key)
    paths.root.mkdir(parents=True)
    egress = networks.choose(None)
    spec = containers.spec("c", {}, paths, egress, Profiles(cfg, "img").get("big"), key, "sid")
    ca = (tmp_path / "state" / "egress-ca" / "ca.crt").read_bytes()
    env = spec.environment
    assert env["GITHUB_TOKEN"].startswith("stk_ph_")
    assert env["GIT_TOKEN"].startswith("stk_ph_")
    assert env["NODE_OPTIONS"] == "--require /usr/local/lib/stockade/proxy.js"
    assert VALUE not in repr(spec)
    assert "GITHUB_TOKEN" not in spec.secret_names
    mounted = {m.target: Path(m.source) for m in spec.mounts if m.read_only}
    assert mounted[brokering.SANDBOX_CA].read_bytes() == ca
    # a pool container (no key yet) and a sandbox of no egress get neither
    bare = containers.spec("p", {}, paths, egress)
    assert "GITHUB_TOKEN" not in bare.environment
    assert not any(m.read_only for m in bare.mounts)
    closed = containers.spec(
        "n", {}, paths, networks.choose(NetworkRequest("none")), None, key, "s"
    )
    assert "GITHUB_TOKEN" not in closed.environment
    assert "NODE_OPTIONS" not in closed.environment
