"""Brokered secrets through a sandbox's life, and their reload (cli/reloading.py).

- A sandbox's placeholders are its key's: the same after a re-creation (a heal, a restore, a
  destroy and ensure) and after a supervisor restart (a new Brokering over the same state
  directory); each fork (a new key) has its own, and a fork's placeholder, or any
  placeholder not the sandbox's own, is refused by the source's or a sibling's proxy
  wherever it goes, even in the configured header to the secret's own host.
- A reload swaps the secrets in one assignment: a removed secret is retired in a running
  sandbox's Broker (never injected, its placeholder refused), a changed value is injected
  from then on, an added one waits for the next container; on a kept-alive intercepted
  connection the next request gets the new Broker, the one under way finished with the old.
- The Reloader: what changed by name (never a value), the settings it cannot reload named
  and kept, a file that does not load changes nothing, each reload audited and answered in
  STATE/reload.json for `stockade reload`, which finds the serving process by its lock."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import pytest

from stockade.supervisor.cli import reloading
from stockade.supervisor.cli.parsing import parse
from stockade.supervisor.cli.reloading import (
    Reloadable,
    Reloader,
    changed_settings,
    serving_pid,
)
from stockade.supervisor.config import SecretConfig
from stockade.supervisor.config.loading import load_config
from stockade.supervisor.keys import sandbox_id
from stockade.supervisor.models import CallContext
from stockade.supervisor.network.brokered import (
    NOT_OURS,
    Broker,
    BrokeredSecret,
    find_placeholder,
    inject,
)
from stockade.supervisor.observe.audit import AuditLog, AuditRecord
from stockade.supervisor.policy.approvals import AllowAlways, ApprovalManager
from stockade.supervisor.policy.scrub.scrubber import Scrubber
from stockade.supervisor.policy.tool_policy import PolicyEngine
from stockade.supervisor.sandboxes.brokering import Brokering, SecretChanges
from stockade.supervisor.sandboxes.owner import InstanceLock
from stockade.supervisor.tools.catalog import Catalog
from tests.unit.intercept_harness import (
    GH_PH,
    GH_REAL,
    SECRETS,
    Harness,
    get,
    once,
    read_response,
    tunnel,
)
from tests.unit.intercept_harness import basic as basic_header

VALUE = "ghp_RealSecretValue0123456789abcdefXYZ"
NEW_VALUE = "ghp_NewSecretValue9876543210abcdefQRS"
CA = b"-----BEGIN CERTIFICATE-----\nTESTCA\n-----END CERTIFICATE-----\n"
SOURCE, FORKS = "src", ("fork-1", "fork-2", "fork-3")
FOREIGN = "stk_ph_" + "x" * 32
"""Shaped as a placeholder, none of the intercept harness's sandbox."""


def write_config(tmp_path: Path, *, git: bool = True, value: str = VALUE, extra: str = "") -> Path:
    token = tmp_path / "token"
    token.write_text(value + "\n")
    token.chmod(0o600)
    path = tmp_path / "stockade.toml"
    text = (
        f'listen = "unix:{tmp_path / "api.sock"}"\nstate_dir = "{tmp_path / "state"}"\n'
        '[sandbox]\nnetwork = "egress"\n'
        f'[secrets.github]\nfile = "{token}"\nhosts = ["api.github.com"]\n'
        'template = "Bearer {secret}"\nsandbox_env = "GITHUB_TOKEN"\n'
    )
    if git:
        text += (
            f'[secrets.git]\nfile = "{token}"\nhosts = ["git.example.com"]\n'
            'basic_user = "x-access-token"\nsandbox_env = "GIT_TOKEN"\n'
        )
    path.write_text(text + extra)
    return path


def broker_of(brokering: Brokering, key: str) -> Broker:
    return brokering.broker(key, sandbox_id(key), "")


def held(broker: Broker, name: str) -> BrokeredSecret:
    (found,) = [s for s in broker.secrets if s.name == name]
    return found


# placeholders per sandbox, per fork


def test_a_sandbox_keeps_its_placeholders_through_re_creation_and_restart(tmp_path: Path) -> None:
    cfg = load_config(write_config(tmp_path))
    first = Brokering(cfg, lambda: CA)
    before = first.container_parts(SOURCE, sandbox_id(SOURCE), "", "egress", tmp_path)
    # a heal, a restore or a destroy and ensure: a new container of the same key
    again = first.container_parts(SOURCE, sandbox_id(SOURCE), "", "egress", tmp_path)
    # a restarted supervisor: a new Brokering over the same state directory
    restarted = Brokering(load_config(write_config(tmp_path)), lambda: CA)
    after = restarted.container_parts(SOURCE, sandbox_id(SOURCE), "", "egress", tmp_path)
    assert before.environment["GITHUB_TOKEN"] == again.environment["GITHUB_TOKEN"]
    assert before.environment == after.environment
    assert (
        held(broker_of(restarted, SOURCE), "github").placeholder
        == (before.environment["GITHUB_TOKEN"])
    )


def test_each_fork_has_its_own_placeholders(tmp_path: Path) -> None:
    brokering = Brokering(load_config(write_config(tmp_path)), lambda: CA)
    keys = (SOURCE, *FORKS)
    every = [s.placeholder for key in keys for s in broker_of(brokering, key).secrets]
    assert len(set(every)) == len(every) == 2 * len(keys)


@pytest.mark.parametrize("user", [*FORKS[1:], SOURCE])
def test_a_forks_placeholder_is_refused_by_its_source_and_its_siblings(
    tmp_path: Path, user: str
) -> None:
    brokering = Brokering(load_config(write_config(tmp_path)), lambda: CA)
    fork_ph = held(broker_of(brokering, FORKS[0]), "github").placeholder
    own = broker_of(brokering, user)
    header = f"Bearer {fork_ph}"
    # in the configured header, to the secret's own host: not injected, and found as foreign
    assert inject(own, "Authorization", header, "api.github.com") is None
    for data in (
        f"Authorization: {header}",
        f"?t={fork_ph}",
        fork_ph.upper(),
        f'{{"t":"{fork_ph}"}}',
    ):
        found = find_placeholder(own, data.encode())
        assert found is not None, data
        assert (found.name, found.placeholder, found.value) == (NOT_OURS, fork_ph, "")
    # its own is injected, and the fork's own proxy injects the fork's
    mine = held(own, "github").placeholder
    assert inject(own, "Authorization", f"Bearer {mine}", "api.github.com") is not None
    fork = broker_of(brokering, FORKS[0])
    assert inject(fork, "Authorization", header, "api.github.com") == (
        f"Bearer {VALUE}",
        held(fork, "github"),
    )


def test_a_placeholder_lookalike_is_refused_only_where_secrets_are_held() -> None:
    shaped = b"stk_ph_" + b"q" * 32
    assert find_placeholder(Broker(), shaped) is None  # no secrets: nothing intercepted
    found = find_placeholder(Broker(SECRETS), shaped)
    assert found is not None
    assert found.name == NOT_OURS
    for near in (b"stk_ph_" + b"q" * 31, b"stk_ph_" + b"1" * 32, b"stk-ph-" + b"q" * 32):
        assert find_placeholder(Broker(SECRETS), near) is None, near


# the reload's swap


def test_a_reload_retires_a_removed_secret_and_changes_a_value(tmp_path: Path) -> None:
    brokering = Brokering(load_config(write_config(tmp_path)), lambda: CA)
    old = broker_of(brokering, SOURCE)
    reloaded = load_config(write_config(tmp_path, git=False, value=NEW_VALUE))
    changes = brokering.reload(reloaded.secrets)
    assert changes == SecretChanges(removed=("git",), changed=("github",))
    new = brokering.rebroker(old, SOURCE, "")
    github, git = held(new, "github"), held(new, "git")
    assert github.placeholder == held(old, "github").placeholder
    assert inject(new, "Authorization", f"Bearer {github.placeholder}", "api.github.com") == (
        f"Bearer {NEW_VALUE}",
        github,
    )
    # retired: its placeholder still intercepted and found, never injected, no value kept
    assert (git.retired, git.value, git.placeholder) == (True, "", held(old, "git").placeholder)
    assert new.intercepts("git.example.com")
    basic = "Basic " + __import__("base64").b64encode(f"x:{git.placeholder}".encode()).decode()
    assert inject(new, "Authorization", basic, "git.example.com") is None
    assert find_placeholder(new, git.placeholder.encode()) is git
    # the old Broker is untouched: a request under way finishes with it
    assert held(old, "github").value == VALUE
    assert not held(old, "git").retired
    # a container made from now on gets no placeholder of the removed secret
    parts = brokering.container_parts(SOURCE, sandbox_id(SOURCE), "", "egress", tmp_path)
    assert "GIT_TOKEN" not in parts.environment
    assert "GITHUB_TOKEN" in parts.environment


def test_a_secret_added_at_reload_waits_for_the_next_container(tmp_path: Path) -> None:
    brokering = Brokering(load_config(write_config(tmp_path, git=False)), lambda: CA)
    old = broker_of(brokering, SOURCE)
    changes = brokering.reload(load_config(write_config(tmp_path)).secrets)
    assert changes == SecretChanges(added=("git",))
    assert [s.name for s in brokering.rebroker(old, SOURCE, "").secrets] == ["github"]
    assert [s.name for s in broker_of(brokering, SOURCE).secrets] == ["github", "git"]


def test_a_secret_back_after_its_removal_stays_retired_in_the_running_sandbox(
    tmp_path: Path,
) -> None:
    brokering = Brokering(load_config(write_config(tmp_path)), lambda: CA)
    first = broker_of(brokering, SOURCE)
    brokering.reload(load_config(write_config(tmp_path, git=False)).secrets)
    second = brokering.rebroker(first, SOURCE, "")
    brokering.reload(load_config(write_config(tmp_path)).secrets)
    third = brokering.rebroker(second, SOURCE, "")
    assert held(third, "git").retired  # as the audit said: removed for it, until re-created


async def test_a_kept_alive_connection_takes_the_reloaded_broker_at_its_next_request(
    h: Harness,
) -> None:
    reader, writer = await tunnel(h)
    request = get("/echo", f"Authorization: Bearer {GH_PH}").replace(
        b"{port}", str(h.up.port).encode()
    )
    writer.write(request)
    assert (await read_response(reader)).status == 200
    retired = tuple(
        dataclasses.replace(s, value="", retired=True) if s.placeholder == GH_PH else s
        for s in SECRETS
    )
    h.proxy.rebroker(Broker(retired))
    writer.write(request)
    reply = await read_response(reader)
    writer.close()
    assert reply.status == 403, reply.head
    assert b"secret 'gh' was removed from the configuration" in reply.body
    assert [r.header("authorization") for r in h.up.requests] == [f"Bearer {GH_REAL}"]
    assert len(h.injected) == 1
    assert [a.kind for a in h.alarms] == ["placeholder"]


@pytest.mark.parametrize(
    "header",
    [
        f"Authorization: Bearer {FOREIGN}",
        f"Authorization: Bearer {FOREIGN.upper()}",
        basic_header("bot", FOREIGN),
        f"X-Api-Key: {FOREIGN}",
    ],
)
async def test_another_sandboxs_placeholder_never_reaches_the_upstream(
    h: Harness, header: str
) -> None:
    reply = await once(h, get("/echo", header))
    assert reply.status == 403, reply.head
    assert b"a placeholder that is not this sandbox's is sent nowhere" in reply.body
    assert b"may not go to this host" not in reply.body
    assert h.up.requests == []
    assert not h.injected
    assert [(a.kind, a.where) for a in h.alarms] == [("placeholder", "egress")]


def test_a_proxy_without_the_ca_is_given_no_secrets() -> None:
    from stockade.supervisor.config.allowlist import Allowlist
    from stockade.supervisor.network.proxy import EgressProxy, ProxySettings

    settings = ProxySettings(frozenset({443}), {}, False, 4, 1.0, 1.0)
    bare = EgressProxy("k", Allowlist([], []), settings, lambda _d: None)
    with pytest.raises(ValueError, match="egress CA"):
        bare.rebroker(Broker(SECRETS))
    assert bare.broker == Broker()


def test_the_scrubber_learns_a_new_value_and_keeps_the_old() -> None:
    scrubber = Scrubber([VALUE])
    scrubber.learn([VALUE, NEW_VALUE])
    text, count = scrubber.scrub(f"a {VALUE} b {NEW_VALUE} c")
    assert (VALUE in text, NEW_VALUE in text, count) == (False, False, 2)


# the Reloader


class Audit:
    def __init__(self) -> None:
        self.records: list[AuditRecord] = []

    def record(self, record: AuditRecord) -> None:
        self.records.append(record)


@dataclasses.dataclass
class Parts:
    """A Reloader's parts: a real Brokering, Scrubber and the records an audit log got."""

    brokering: Brokering
    tools: PolicyEngine
    approvals: ApprovalManager
    scrubber: Scrubber = dataclasses.field(default_factory=lambda: Scrubber([VALUE]))
    audit: Audit = dataclasses.field(default_factory=Audit)
    given: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def records(self) -> list[AuditRecord]:
        return self.audit.records

    def reload_secrets(self, secrets: Mapping[str, SecretConfig]) -> SecretChanges:
        self.given.append(dict(secrets))
        return self.brokering.reload(secrets)


def reloader(tmp_path: Path, path: Path) -> tuple[Reloader, Parts]:
    cfg = load_config(path)
    fake = Parts(
        Brokering(cfg, lambda: CA),
        tools=PolicyEngine(cfg, Catalog(cfg.custom_tools)),
        approvals=ApprovalManager(cfg.approvals, cfg.agents, AllowAlways(tmp_path / "db")),
    )
    cfg.state_dir.mkdir(parents=True, exist_ok=True)
    parts = Reloadable(
        fake.reload_secrets, fake.scrubber, cast(AuditLog, fake.audit), fake.tools, fake.approvals
    )
    return Reloader(parts, cfg, lambda: load_config(path)), fake


async def test_a_reload_applies_secrets_keeps_the_rest_and_says_so(tmp_path: Path) -> None:
    path = write_config(tmp_path)
    reload, fake = reloader(tmp_path, path)
    write_config(tmp_path, git=False, value=NEW_VALUE)
    path.write_text(
        path.read_text().replace("[sandbox]", '[engine]\nkind = "docker"\n[sandbox]')
        + "[limits]\nrate_per_s = 3.0\n"
    )
    report = await reload.reload()
    assert report.error == ""
    assert report.secrets == SecretChanges(removed=("git",), changed=("github",))
    assert report.not_reloaded == ("engine.kind", "limits.rate_per_s")
    assert report.by == "SIGHUP"
    assert list(fake.given[0]) == ["github"]
    assert fake.scrubber.scrub(NEW_VALUE)[1] == 1  # learnt before any proxy had it
    (record,) = fake.records
    assert (record.tool, record.caller, record.is_error) == ("reload", "SIGHUP", False)
    assert "removed: git" in record.policy_step
    assert "engine.kind" in record.policy_step
    for text in (record.arguments_json, record.policy_step):
        assert VALUE not in text
        assert NEW_VALUE not in text
    answer = json.loads((tmp_path / "state" / reloading.RESULT).read_text())
    assert answer["ok"] is True
    assert answer["secrets"]["removed"] == ["git"]
    # the kept settings stay kept: the next reload compares with what runs
    again = await reload.reload()
    assert again.not_reloaded == ("engine.kind", "limits.rate_per_s")
    assert again.secrets == SecretChanges()


async def test_a_reload_swaps_the_tool_policy_and_approvals(tmp_path: Path) -> None:
    path = write_config(tmp_path)
    reload, fake = reloader(tmp_path, path)
    tools, approvals = fake.tools, fake.approvals
    agent = CallContext(agent_id="bot")
    assert tools.decide("exec", agent).allowed
    assert approvals.reason_to_ask("bot", "ls") is None  # approvals off
    before = tools._rules
    path.write_text(
        path.read_text()
        + '[tools]\ndeny = ["glob"]\n[agents.bot]\napprovals = "always"\n'
        + '[agents.bot.tools]\ndeny = ["exec"]\n[approvals]\ntimeout_s = 30.0\n'
    )
    report = await reload.reload()
    assert report.error == ""
    assert report.policy == ("tools.deny", "agents", "approvals.timeout_s")
    assert report.not_reloaded == ()
    assert not tools.decide("exec", agent).allowed
    assert tools.decide("exec", agent).step == "agents.bot.tools.deny"
    assert not tools.decide("glob", CallContext()).allowed
    assert approvals.reason_to_ask("bot", "ls") == (
        "approvals mode always: every command needs a decision"
    )
    assert before.decide("exec", agent).allowed  # a decision under way kept its rules
    assert "policy changed: " in fake.records[-1].policy_step
    # a name the catalog does not know: nothing changes, the secrets neither
    path.write_text(path.read_text().replace('deny = ["glob"]', 'deny = ["no-such-tool"]'))
    (tmp_path / "token").write_text(NEW_VALUE + "\n")
    failed = await reload.reload()
    assert "no-such-tool" in failed.error
    assert not tools.decide("glob", CallContext()).allowed
    assert fake.given[-1]["github"].value == VALUE
    assert len(fake.given) == 1


async def test_a_file_that_does_not_load_changes_nothing(tmp_path: Path) -> None:
    path = write_config(tmp_path)
    reload, fake = reloader(tmp_path, path)
    for broken, says in (
        ("[secrets.github]\nhosts = [", "cannot read config"),
        (path.read_text() + "[secrets.x]\nenv = \"NOT_SET_ANYWHERE_X\"\nhosts = [\"a.test\"]\n",
         "secrets.x"),
        (path.read_text().replace('network = "egress"', 'network = "none"'), "egress"),
    ):  # fmt: skip
        path.write_text(broken)
        report = await reload.reload()
        assert says in report.error
        assert report.secrets == SecretChanges()
    assert fake.given == []
    assert all(r.is_error and r.error_code == "INVALID_ARGUMENT" for r in fake.records)
    answer = json.loads((tmp_path / "state" / reloading.RESULT).read_text())
    assert answer["ok"] is False
    assert answer["summary"].startswith("nothing reloaded:")


async def test_a_request_names_who_asked_and_is_taken_once(tmp_path: Path) -> None:
    path = write_config(tmp_path)
    reload, fake = reloader(tmp_path, path)
    request = tmp_path / "state" / reloading.REQUEST
    request.write_text(json.dumps({"request": "abc", "by": "stockade reload (ops\x1b[2J)"}))
    report = await reload.reload()
    assert (report.request, report.by) == ("abc", "stockade reload (ops\\x1b[2J)")
    assert not request.exists()
    assert fake.records[0].caller == report.by
    assert json.loads((tmp_path / "state" / reloading.RESULT).read_text())["request"] == "abc"
    request.write_text("[1, 2")  # not JSON: a bare signal
    assert (await reload.reload()).by == "SIGHUP"
    assert not request.exists()
    (tmp_path / "elsewhere").write_text(json.dumps({"request": "x", "by": "forged"}))
    request.symlink_to(tmp_path / "elsewhere")  # a link is not followed, but removed
    assert (await reload.reload()).by == "SIGHUP"
    assert not request.is_symlink()


async def test_an_oversized_or_special_request_file_is_a_bare_signal(tmp_path: Path) -> None:
    path = write_config(tmp_path)
    reload, _fake = reloader(tmp_path, path)
    request = tmp_path / "state" / reloading.REQUEST
    padded = {"request": "big", "by": "x" * (1 << 20)}  # past the 4096 bytes read: not JSON
    request.write_text(json.dumps(padded))
    assert ((await reload.reload()).request, request.exists()) == ("", False)
    request.write_text(json.dumps({"request": "r" * 500, "by": "b" * 1000}))
    report = await reload.reload()
    assert (len(report.request), len(report.by)) == (64, reloading.MAX_BY)
    os.mkfifo(request)  # never opened for a blocking read: no writer would ever come
    assert (await reload.reload()).by == "SIGHUP"
    assert not request.exists()
    request.write_text(json.dumps(["a", "list"]))
    assert (await reload.reload()).by == "SIGHUP"


async def test_reloads_at_once_run_one_after_the_other(tmp_path: Path) -> None:
    path = write_config(tmp_path)
    reload, fake = reloader(tmp_path, path)
    reports = await asyncio.gather(*(reload.reload() for _ in range(5)))
    assert all(r.error == "" for r in reports)
    assert len(fake.records) == 5


def test_changed_settings_name_the_keys(tmp_path: Path) -> None:
    old = load_config(write_config(tmp_path))
    new = dataclasses.replace(old, listen="127.0.0.1:1")
    assert changed_settings(old, new) == ["listen"]
    assert changed_settings(old, old) == []


def test_the_serving_process_is_found_by_its_lock(tmp_path: Path) -> None:
    assert serving_pid(tmp_path) is None
    lock = InstanceLock(tmp_path)
    try:
        assert serving_pid(tmp_path) == os.getpid()
    finally:
        lock.release()
    assert serving_pid(tmp_path) is None


def test_stockade_reload_without_a_supervisor_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from stockade.supervisor.cli.main import main

    assert main(["reload", "--state-dir", str(tmp_path), "--timeout", "1"]) == 1
    assert "no `stockade serve` holds the state directory" in capsys.readouterr().err
    ns = parse(["reload", "--config", "/etc/stockade.toml"])
    assert (ns.command, ns.config, ns.timeout) == ("reload", Path("/etc/stockade.toml"), 60.0)


# decoys through a restore and a fork (with the in-memory engine, the real planting script)


async def test_a_restored_sandbox_and_each_fork_have_their_decoys_planted(
    tmp_path: Path,
) -> None:
    from stockade.supervisor.config import HoneytokensConfig
    from tests.unit.fakes import FakeBackend
    from tests.unit.test_honeytokens_planting import make, plants

    backend = FakeBackend()
    mgr, wire, agents = make(tmp_path, backend, HoneytokensConfig(enabled=True))
    await mgr.start()
    first = await mgr.ensure("k")
    assert plants(agents) == 1
    await mgr.snapshots.snapshot("k", "s", include_tmp=False, include_memory=False, reason="t")
    await mgr.snapshots.restore("k", "s", "back")
    restored = mgr.registry["k"]
    assert restored.info.id != first.info.id
    assert restored.decoys_planted  # before any call: planted with the container
    assert plants(agents) == 2
    forks = ["f1", "f2", "f3"]
    await mgr.snapshots.fork("k", forks, include_tmp=False, include_memory=False, reason="r")
    assert all(mgr.registry[f].decoys_planted for f in forks)
    assert plants(agents) == 5
    planted = [
        args["env"]["STK_C0"]
        for agent in agents
        for _tool, args in agent.calls
        if "STK_N" in args.get("env", {})
    ]
    # each its own (the forks' containers are made at once: in any order)
    assert sorted(planted[-3:]) == sorted(wire.decoys(f).aws_file() for f in forks)
    assert len({*planted[-3:], wire.decoys("k").aws_file()}) == 4
    for key in ("k", *forks):
        await mgr.ensure(key)
    assert plants(agents) == 5  # once per container
    await mgr.close()
