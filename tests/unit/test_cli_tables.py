"""The CLI's tables show a key's or a record's hidden characters (bidi overrides, escape
sequences, new lines) as escapes, as the console does (issue 32): `stockade ls`,
`stockade audit list` and `stockade approvals list` over a stand-in client."""

from __future__ import annotations

import argparse
import importlib
from datetime import UTC, datetime
from types import SimpleNamespace, TracebackType
from typing import Any

import pytest

main = importlib.import_module("stockade.supervisor.cli.main")  # the package names a function so

BIDI = "invoice-\u202egpj.exe"
HOSTILE = "\x1b[2J\u202e\r\nforged line"


class Client:
    """Stands in for the gRPC client: what the three commands read."""

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None

    def list_sandboxes(self) -> list[Any]:
        return [
            SimpleNamespace(
                key=BIDI, state="RUNNING", engine="podman", container_id="c" * 64,
                workspace_path="/w", trouble=HOSTILE, quarantined_at=None, paused_at=None,
                heals=0, last_healed_at=None,
            )
        ]  # fmt: skip

    def list_audit(self, **_: Any) -> list[Any]:
        return [
            SimpleNamespace(
                time=datetime.now(UTC), sandbox_key=BIDI, agent_id=HOSTILE, tool="alarm",
                error_code="", front="grpc", guard_rule=HOSTILE, approval="", duration_ms=1,
                policy_step=f"alarm: guard at operator: {HOSTILE}",
            )
        ]  # fmt: skip

    def list_approvals(self) -> Any:
        pending = SimpleNamespace(id="p1", sandbox_key=BIDI, agent_id="", command=HOSTILE)
        return SimpleNamespace(pending=[pending], approvers=1, always_allowed=[HOSTILE])


@pytest.mark.parametrize(
    ("run", "ns"),
    [
        (main._ls, {}),
        (main._audit, {"action": "list", "key": "", "tool": "", "agent": "", "since": None,
                       "limit": 10, "errors": False, "json": False}),
        (main._approvals, {"approvals_command": "list"}),
    ],
)  # fmt: skip
def test_hidden_characters_are_shown_in_the_cli_tables(
    run: Any,
    ns: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(main, "_client", lambda _ns: Client())
    assert run(argparse.Namespace(**ns)) == 0
    out = capsys.readouterr().out
    for c in ("\u202e", "\x1b", "\r"):
        assert c not in out, repr(c)
    assert "invoice-\\u202egpj.exe" in out
    assert all(not line.startswith("forged line") for line in out.splitlines())
