"""Stockade's policy on commands that come through the E2B front, driven by the unmodified
e2b SDK against the real `stockade serve` on both engines: a guard refusal, an approval
granted and one denied by a human (the command waits for the answer), a credential scrubbed
from the output, a rate limit and a refused user (root) each reach the SDK as an error or
output a user can act on, and each is in the audit log with the front named."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from e2b import RateLimitException, Sandbox, SandboxException

from stockade.client import ApprovalRequest
from tests.integration.e2b_kit import E2bServed, serving_e2b
from tests.integration.harness import an_approver_connected
from tests.integration.test_mcp import FAKE_AWS_KEY

pytestmark = pytest.mark.timeout(300)
BURST = 8
CONFIG = f"""
[approvals]
mode = "on-miss"
allowlist = ["/bin/bash -l -c 'echo *", "/bin/bash -l -c true"]
timeout_s = 60
[limits]
rate_per_s = 0.001
burst = {BURST}
"""
"""E2B runs `/bin/bash -l -c '<command>'`: the allowlist names that command line."""


@pytest.fixture(scope="module")
def served(engine: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2bServed]:
    with serving_e2b(engine, tmp_path_factory.mktemp("e2bpol"), CONFIG) as served:
        yield served


class Approver:
    """A human at the ApprovalService (tenant acme's) answering each request with the next
    decision of `decisions`."""

    def __init__(self, served: E2bServed, decisions: list[str]) -> None:
        self.client = served.sup.client(token=served.token)
        self.decisions = decisions
        self.asked: list[ApprovalRequest] = []
        self.stream = self.client.watch_approvals("human")
        self.thread = threading.Thread(target=self._answer, daemon=True)
        self.thread.start()
        an_approver_connected(self.client)

    def _answer(self) -> None:
        for event in self.stream:
            if isinstance(event, ApprovalRequest) and self.decisions:
                self.asked.append(event)
                time.sleep(0.5)  # the command waits meanwhile
                self.client.resolve_approval(event.id, self.decisions.pop(0), "human")

    def close(self) -> None:
        self.client.close()
        self.thread.join(5)


def _records(served: E2bServed, sandbox_id: str) -> list[Any]:
    with served.sup.client(token=served.token) as client:
        return [
            r for r in client.list_audit(limit=500, tool="process")
            if sandbox_id in r.sandbox_key and r.front == "e2b"
        ]  # fmt: skip


def test_policy_reaches_the_sdk_and_the_audit(served: E2bServed) -> None:
    sbx = Sandbox.create(timeout=120, **served.opts())
    approver = Approver(served, ["allow-once", "deny"])
    try:
        shown = sbx.commands.run(f"echo key={FAKE_AWS_KEY}")
        assert FAKE_AWS_KEY not in shown.stdout
        assert shown.stdout.startswith("key=")

        with pytest.raises(SandboxException) as refused:
            sbx.commands.run("rm -rf /home/user")
        assert "permission_denied" in str(refused.value).lower()
        assert "guard" in str(refused.value)

        started = time.monotonic()
        ran = sbx.commands.run("touch approved && echo made")
        assert ran.stdout == "made\n"
        assert time.monotonic() - started >= 0.4  # it waited for the human
        with pytest.raises(SandboxException) as denied:
            sbx.commands.run("touch denied")
        assert "permission_denied" in str(denied.value).lower()
        assert [a.command for a in approver.asked] == [
            "/bin/bash -l -c 'touch approved && echo made'",
            "/bin/bash -l -c 'touch denied'",
        ]
        listing = sbx.commands.run("echo *").stdout.split()
        assert "approved" in listing
        assert "denied" not in listing

        with pytest.raises(SandboxException) as root:
            sbx.commands.run("true", user="root")
        assert "permission_denied" in str(root.value).lower()
        assert "'root' is not available" in str(root.value)

        def run_until_limited() -> None:
            for _ in range(BURST + 1):
                sbx.commands.run("true")

        with pytest.raises(RateLimitException):
            run_until_limited()

        records = _records(served, sbx.sandbox_id)
        by_command = {r.arguments_json: r for r in records}

        def record(fragment: str) -> Any:
            found = [r for args, r in by_command.items() if fragment in args]
            assert found, f"no audit record for {fragment}: {list(by_command)}"
            return found[-1]

        assert record("echo key=").redactions >= 1
        assert record("rm -rf").error_code == "PERMISSION_DENIED"
        assert record("rm -rf").guard_rule
        assert record("touch approved").approval == "allow-once"
        assert record("touch denied").approval == "deny"
        assert any(r.error_code == "RATE_LIMITED" for r in records)
    finally:
        approver.close()
        sbx.kill()
