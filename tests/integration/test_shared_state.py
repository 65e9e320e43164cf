"""Two real supervisors sharing one PostgreSQL state (`[state] url`), each with its own state
directory and address, on Podman: an approval asked through one is listed and decided
through the other and the waiting call proceeds (and an allow-always decided there holds
here); the audit is one log, read through either; a tenant's sandbox quota holds across
both. The PostgreSQL server is a real one the test starts (tests/pg.py)."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from stockade.client import (
    ApprovalClosed,
    ApprovalRequest,
    CallContext,
    ResourceExhausted,
    Stockade,
    ToolResult,
)
from tests.integration.harness import Supervisor, bring_up, running_supervisor
from tests.pg import postgres_server

pytestmark = pytest.mark.timeout(300)
ASKER = CallContext(agent_id="asker")


@dataclass
class Pair:
    one: Supervisor
    two: Supervisor
    tokens: dict[str, str]

    def client(self, sup: Supervisor, tenant: str) -> Stockade:
        return sup.client(token=self.tokens[tenant])


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    bring_up("podman")
    tokens = {tenant: secrets.token_hex(20) for tenant in ("a", "lim")}
    tokens_file = tmp_path_factory.mktemp("auth") / "tokens"
    tokens_file.write_text("".join(f"{tok} {tenant}\n" for tenant, tok in tokens.items()))
    tokens_file.chmod(0o600)
    with postgres_server() as server:
        url = server.create_database("stockade")
        config = (
            f'[state]\nurl = "{url}"\n'
            f'[auth]\ntokens_file = "{tokens_file}"\n'
            '[agents.asker]\napprovals = "always"\n[approvals]\ntimeout_s = 60.0\n'
            "[tenants.lim]\nmax_sandboxes = 2\n"
        )
        with (
            running_supervisor("podman", auth_config=config) as one,
            running_supervisor("podman", auth_config=config) as two,
        ):
            assert one.instance_id() != two.instance_id()
            yield Pair(one, two, tokens)
            for sup in (one, two):
                assert url.split("@")[0].split(":")[-1] not in sup.log(), "a password was logged"


class Approver:
    """An approver connected to one supervisor, deciding each request with `decision`."""

    def __init__(self, client: Stockade, decision: str) -> None:
        self.client, self.decision = client, decision
        self.events: list[ApprovalRequest | ApprovalClosed] = []
        self.listed: list[str] = []
        """The commands ListApprovals showed pending here, just before each decision."""
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        for event in self.client.watch_approvals("bob"):
            self.events.append(event)
            if isinstance(event, ApprovalRequest):
                self.listed += [p.command for p in self.client.list_approvals().pending]
                self.client.resolve_approval(event.id, self.decision, "bob")

    def close(self) -> None:
        self.client.close()
        self.thread.join(5)


def until(check: object, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_asked_through_one_decided_through_the_other(pair: Pair) -> None:
    with pair.client(pair.one, "a") as asking:
        # no approver on `one`: a call that needs one is denied at once
        denied = asking.call("ap", "exec", {"command": "echo nobody"}, context=ASKER)
        assert denied.error_code == "APPROVAL_DENIED"
        approver = Approver(pair.client(pair.two, "a"), "allow-always")
        try:
            until(lambda: asking.list_approvals().approvers == 1, "one never saw two's approver")
            result: list[ToolResult] = []
            call = threading.Thread(
                target=lambda: result.append(
                    asking.call("ap", "exec", {"command": "echo approved"}, context=ASKER)
                )
            )
            call.start()
            call.join(60)
            assert result, "the call through one did not proceed"
            assert result[0].stdout == "approved\n"
            assert approver.listed == ["echo approved"]  # ListApprovals through two showed it
            requests = [e for e in approver.events if isinstance(e, ApprovalRequest)]
            assert [r.command for r in requests] == ["echo approved"]
            until(
                lambda: any(isinstance(e, ApprovalClosed) for e in approver.events),
                "two's approver never saw the request close",
            )
            assert asking.list_approvals().pending == []
        finally:
            approver.close()
        # the allow-always decided through two holds through one, with no approver left
        until(lambda: asking.list_approvals().approvers == 0, "two's approver still counted")
        assert "echo approved" in asking.list_approvals().always_allowed
        again = asking.call("ap", "exec", {"command": "echo approved"}, context=ASKER)
        assert again.stdout == "approved\n"
        audit = asking.list_audit(sandbox_key="ap", limit=10)
        decided = [r for r in audit if r.approval == "allow-always"]
        assert [r.approver for r in decided] == ["bob"]


def test_the_audit_is_one_log(pair: Pair) -> None:
    with pair.client(pair.one, "a") as one, pair.client(pair.two, "a") as two:
        assert one.sandbox("via-one").exec("echo 1").stdout == "1\n"
        assert two.sandbox("via-two").exec("echo 2").stdout == "2\n"
        for client in (one, two):
            # another supervisor's records land with its next batch (audit.BATCH_WINDOW_S)
            until(
                lambda c=client: (
                    {"via-one", "via-two"} <= {r.sandbox_key for r in c.list_audit(limit=1000)}
                ),
                "the audit through one supervisor misses the other's records",
                timeout=5,
            )
            assert client.list_audit(sandbox_key="via-two", tool="exec", limit=5)
            assert client.list_audit(sandbox_key="via-one", tool="exec", limit=5)
        with pair.client(pair.one, "lim") as other:  # and still one log per tenant
            assert not {r.sandbox_key for r in other.list_audit(limit=1000)} & {"via-one"}


def test_a_tenant_quota_holds_across_both(pair: Pair) -> None:
    with pair.client(pair.one, "lim") as one, pair.client(pair.two, "lim") as two:
        one.ensure_sandbox("q1")
        one.ensure_sandbox("q2")
        with pytest.raises(ResourceExhausted, match="at most 2 sandbox"):
            two.ensure_sandbox("q3")
        assert [s.key for s in two.list_sandboxes() if s.state == "RUNNING"] == []
        one.destroy_sandbox("q1", delete_workspace=True)
        # one's heartbeat gives q1's place back within seconds: two may take it
        deadline = time.monotonic() + 20
        while True:
            try:
                two.ensure_sandbox("q3")
                break
            except ResourceExhausted:
                assert time.monotonic() < deadline, "q1's place was never given back"
                time.sleep(0.5)
        with pytest.raises(ResourceExhausted):
            one.ensure_sandbox("q1")


def test_state_url_unreachable_is_a_plain_error(tmp_path: Path) -> None:
    """A supervisor whose database cannot be reached does not start, and says where (not
    with the password)."""
    from tests.integration.harness import free_tcp_address

    port = free_tcp_address().rsplit(":", 1)[1]
    config = f'[state]\nurl = "postgresql://u:pw-XYZ@127.0.0.1:{port}/db"\n'
    with pytest.raises(RuntimeError) as failed, running_supervisor("podman", config):
        pass
    text = str(failed.value)
    assert f"127.0.0.1:{port}/db" in text
    assert "pw-XYZ" not in text
