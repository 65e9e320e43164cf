"""Brokered secrets and decoys through a sandbox's life, through the real supervisor on Podman
and Docker, against the tests' own HTTPS upstream on 127.0.0.1 (test_brokered_secrets.py's
Upstreams and config: the secret `api` for api.test, decoys on).

- Paused and resumed, healed (its container killed: the supervisor makes another) and
  restored from a snapshot, a sandbox keeps its placeholder (the variable holds the same
  one, and the upstream gets the real value for it) and its own decoys.
- A three-way fork: each fork holds a placeholder of its own, injected for itself alone; a
  fork's placeholder sent from the source or from a sibling, and the source's carried into a
  fork in a workspace file, are refused (403, the upstream sees nothing), audited, and the
  alarm quarantines the sandbox that sent it. Each fork holds its own decoys, not the
  source's.
- `stockade reload`: a changed value is injected from the next request on; a secret removed
  from the file is no longer injected for the running sandbox (its placeholder refused,
  audited, quarantined); the reload is an audit record naming who asked and what changed,
  never a value; a sandbox made after it has no placeholder. A bare SIGHUP reloads the tool
  policy (a tool denied from then on) and names a setting it cannot reload."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from stockade.client import FailedPrecondition, Stockade
from stockade.supervisor.keys import sandbox_id
from stockade.supervisor.policy.honeytokens import derive, load_key
from stockade.supervisor.sandboxes.brokering import installation_key, placeholder
from tests.integration.harness import Supervisor, engine_cli, running_supervisor
from tests.integration.test_brokered_secrets import (
    API_VALUE,
    Upstreams,
    api_secret_config,
    run,
)
from tests.integration.test_faults import wait_for

pytestmark = pytest.mark.timeout(900)
NEW_VALUE = "api_" + uuid.uuid4().hex + uuid.uuid4().hex[:8]


@pytest.fixture(scope="module")
def upstreams(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstreams]:
    ups = Upstreams(tmp_path_factory.mktemp("upstreams"))
    try:
        yield ups
    finally:
        ups.close()


@pytest.fixture(scope="module")
def sup(
    engine: str, upstreams: Upstreams, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Supervisor]:
    config = api_secret_config(upstreams, tmp_path_factory.mktemp("values"), honeytokens=True)
    with running_supervisor(engine, config) as supervisor:
        yield supervisor


@pytest.fixture(scope="module")
def client(sup: Supervisor) -> Iterator[Stockade]:
    with sup.client() as c:
        yield c


def own_placeholder(sup: Supervisor, key: str) -> str:
    return placeholder(installation_key(sup.state_dir), sandbox_id(key), "api")


def curl(upstreams: Upstreams, token: str, tag: str) -> str:
    """A request with `token` in the secret's configured place, to the secret's own host."""
    url = f"https://api.test:{upstreams.api.port}/echo?t={tag}"
    return f'curl -sS -o /dev/null -w "%{{http_code}}" -H "Authorization: Bearer {token}" "{url}"'


def assert_injected(
    client: Stockade, key: str, upstreams: Upstreams, value: str = API_VALUE
) -> None:
    """The sandbox's own placeholder, from its variable, reaches the upstream as `value`."""
    tag = uuid.uuid4().hex
    code, out = run(client, key, curl(upstreams, "$API_TOKEN", tag))
    assert (code, out) == (0, "200"), out
    (got,) = [r for r in upstreams.api.requests if r.target.endswith(f"t={tag}")]
    assert got.header("authorization") == f"Bearer {value}"


def assert_refused(client: Stockade, key: str, upstreams: Upstreams, token: str) -> None:
    """`token` (a placeholder not this sandbox's, or retired) sent in the configured header
    to the secret's host: refused, the upstream sees nothing, the sandbox is quarantined
    (the freeze may land while the call still runs: it then ends at its deadline)."""
    tag = uuid.uuid4().hex
    audited = len(client.list_audit(sandbox_key=key, tool="network", limit=1000))
    result = client.sandbox(key).exec(curl(upstreams, token, tag), timeout=10)
    if result.error_code != "TIMEOUT":
        assert result.stdout.strip().endswith("403"), result
    assert not [r for r in upstreams.api.requests if tag in r.target]
    with pytest.raises(FailedPrecondition, match="quarantined"):
        client.sandbox(key).exec("true")
    assert [a.kind for a in client.get_quarantine(key).quarantine.alarms] == ["placeholder"]
    client.release_quarantine(key)
    records = client.list_audit(sandbox_key=key, tool="network", limit=1000)
    records = records[: len(records) - audited]  # newest first: the ones since
    refusals = [r for r in records if r.is_error and "placeholder" in r.policy_step]
    assert refusals, [r.policy_step for r in records]
    assert not any(API_VALUE in r.arguments_json + r.policy_step for r in records)


def holds_decoy_of(client: Stockade, key: str, sup: Supervisor, owner: str) -> bool:
    """Whether the sandbox's planted AWS credentials are `owner`'s decoys (the needle sent
    reversed, so the command itself carries no decoy)."""
    needle = derive(load_key(sup.state_dir), owner).aws_secret[::-1]
    script = (
        "import os, sys; "
        "print(sys.argv[1][::-1] in open(os.path.expanduser('~/.aws/credentials')).read())"
    )
    code, out = run(client, key, f"python3 -c \"{script}\" '{needle}'")
    assert code == 0, out
    return out.strip() == "True"


def assert_its_own(client: Stockade, key: str, sup: Supervisor, upstreams: Upstreams) -> None:
    code, out = run(client, key, 'printf %s "$API_TOKEN"')
    assert (code, out) == (0, own_placeholder(sup, key))
    assert_injected(client, key, upstreams)
    assert holds_decoy_of(client, key, sup, key)


def ready_after_kill(client: Stockade, key: str) -> None:
    """Calls until one runs: the first after the kill may end SANDBOX_LOST as it finds the
    container gone; the next runs in the one the supervisor made instead."""
    for _ in range(5):
        result = client.sandbox(key).exec("true", timeout=60)
        if result.exit_code == 0 and not result.error_code:
            return
        assert result.error_code == "SANDBOX_LOST", result
    raise AssertionError("the killed sandbox was not made again")


def test_pause_resume_heal_and_restore_keep_its_placeholder_and_decoys(
    engine: str, sup: Supervisor, client: Stockade, upstreams: Upstreams
) -> None:
    key = f"life-{uuid.uuid4().hex[:8]}"
    box = client.sandbox(key)
    box.ensure()
    assert_its_own(client, key, sup, upstreams)
    snapshot = box.snapshot().name

    assert box.pause() is True
    assert box.resume() is True
    assert_its_own(client, key, sup, upstreams)

    old = box.info().container_id
    assert engine_cli(engine, "kill", old).returncode == 0
    ready_after_kill(client, key)
    healed = box.info()
    assert healed.container_id != old
    assert_its_own(client, key, sup, upstreams)

    box.restore(snapshot)
    assert_its_own(client, key, sup, upstreams)


def test_each_of_three_forks_has_its_own_placeholder_and_decoys(
    sup: Supervisor, client: Stockade, upstreams: Upstreams
) -> None:
    source = f"src-{uuid.uuid4().hex[:8]}"
    client.sandbox(source).ensure()
    code, out = run(client, source, 'printf %s "$API_TOKEN" > carried.txt')
    assert code == 0, out
    forks = [f"{source}-f{i}" for i in range(3)]
    client.sandbox(source).fork(*forks)
    held = {key: own_placeholder(sup, key) for key in (source, *forks)}
    assert len(set(held.values())) == 4
    for key in forks:
        assert_its_own(client, key, sup, upstreams)
        assert not holds_decoy_of(client, key, sup, source)
    records = client.list_audit(sandbox_key=forks[0], tool="network", limit=1000)
    assert any("injected api" in r.policy_step for r in records)

    # a fork's placeholder from its source and from a sibling; the source's, carried over
    assert_refused(client, source, upstreams, held[forks[0]])
    assert_refused(client, forks[1], upstreams, held[forks[0]])
    assert_refused(client, forks[2], upstreams, "$(cat carried.txt)")
    # each still injects its own afterwards
    for key in (source, *forks):
        assert_injected(client, key, upstreams)


def reload(sup: Supervisor) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stockade.supervisor.cli", "reload",
         "--state-dir", str(sup.state_dir)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_stockade_reload_changes_a_value_then_stops_a_removed_secret(
    engine: str, upstreams: Upstreams, tmp_path: Path
) -> None:
    config = api_secret_config(upstreams, tmp_path)
    with running_supervisor(engine, config) as sup, sup.client() as client:
        key = f"rel-{uuid.uuid4().hex[:8]}"
        client.sandbox(key).ensure()
        assert_injected(client, key, upstreams)
        ph = own_placeholder(sup, key)

        (tmp_path / "api").write_text(NEW_VALUE + "\n")
        in_flight: list[object] = []
        call = threading.Thread(
            target=lambda: in_flight.append(
                client.sandbox(key).exec("sleep 3; echo finished", timeout=60)
            )
        )
        call.start()  # a call under way when the reload comes is not dropped
        done = reload(sup)
        call.join(120)
        assert done.returncode == 0, done.stderr
        assert "secrets changed: api" in done.stdout
        (result,) = in_flight
        assert getattr(result, "stdout", "") == "finished\n", result
        assert_injected(client, key, upstreams, NEW_VALUE)

        without = config[: config.index("[secrets.api]")]
        sup.extra_config = without
        sup.config_file()
        done = reload(sup)
        assert done.returncode == 0, done.stderr
        assert "secrets removed: api" in done.stdout
        code, out = run(client, key, 'printf %s "$API_TOKEN"')
        assert out == ph  # the running container keeps its variable: the proxy refuses it
        assert_refused(client, key, upstreams, "$API_TOKEN")

        reloads = client.list_audit(tool="reload", limit=10)
        assert [r.is_error for r in reloads] == [False, False]
        assert all(r.caller.startswith("stockade reload (") for r in reloads)
        assert {"secrets changed: api", "secrets removed: api"} <= {
            r.policy_step.removeprefix("reload: ") for r in reloads
        }
        for r in reloads:
            for value in (API_VALUE, NEW_VALUE):
                assert value not in r.arguments_json + r.policy_step

        later = f"new-{uuid.uuid4().hex[:8]}"
        client.sandbox(later).ensure()
        code, out = run(client, later, 'printf %s "${API_TOKEN-none}"')
        assert (code, out) == (0, "none")

        # the tool policy reloads too; a setting that cannot is named and kept; a bare SIGHUP
        assert not client.call(key, "glob", {"pattern": "*"}).is_error
        sup.extra_config = without + '[tools]\ndeny = ["glob"]\n[limits]\nburst = 7\n'
        sup.config_file()
        assert sup.process is not None
        sup.process.send_signal(signal.SIGHUP)
        wait_for(lambda: len(client.list_audit(tool="reload", limit=10)) == 3, "the SIGHUP reload")
        (latest, *_) = client.list_audit(tool="reload", limit=10)
        assert latest.caller == "SIGHUP"
        assert "policy changed: tools.deny" in latest.policy_step
        assert "not reloaded (restart to apply; the old values stay): limits.burst" in (
            latest.policy_step
        )
        refused = client.call(key, "glob", {"pattern": "*"})
        assert refused.error_code == "PERMISSION_DENIED"
        assert "tools.deny" in refused.error_message
