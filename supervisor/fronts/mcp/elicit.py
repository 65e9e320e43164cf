"""Approvals asked of the MCP client itself, through a form-mode elicitation: the command
(scrubbed) and the reason, and a choice once / always / deny. The answer resolves the same
pending approval the ApprovalService lists (policy/approvals.py runs the question beside the
approvers' wait), so a decision in either place ends the wait in both."""

from __future__ import annotations

from typing import Any

import mcp_types as types

from stockade.supervisor.keys import shown
from stockade.supervisor.policy.approvals import Ask, Decision, Pending
from stockade.supervisor.policy.scrub.scrubber import Scrubber, scrubbed

CHOICES: dict[str, Decision] = {"once": "allow-once", "always": "allow-always", "deny": "deny"}
FIELD = "decision"
SCHEMA: types.ElicitRequestedSchema = {
    "type": "object",
    "properties": {
        FIELD: {
            "type": "string",
            "title": "Decision",
            "description": "once: run it this time; always: run it now and from now on "
            "(this tenant); deny: refuse it",
            "enum": list(CHOICES),
        }
    },
    "required": [FIELD],
}


def supports_forms(capabilities: types.ClientCapabilities | None) -> bool:
    """The client declared form-mode elicitation (an empty `elicitation` object means form
    mode, as before modes existed)."""
    if capabilities is None or capabilities.elicitation is None:
        return False
    elicitation = capabilities.elicitation
    return elicitation.form is not None or elicitation.url is None


def message_of(pending: Pending, scrubber: Scrubber | None) -> str:
    """What the user reads: the tool, the sandbox, the command (a credential in it shown as
    `[REDACTED]`, as the approvers see it) and why a decision is needed; for a file change,
    the diff it will make (scrubbed and bounded already, calls/previews.py)."""
    command = scrubbed(pending.command, scrubber)
    diff = f"What it changes:\n{scrubbed(pending.diff, scrubber)}\n" if pending.diff else ""
    return (
        f"Stockade asks before running this command ({pending.tool}, sandbox "
        f"{shown(pending.sandbox_key)!r}):\n\n{command}\n\n{diff}Reason: {pending.reason}\n"
        f"Approval id: {pending.id}"
    )


def decision_of(result: types.ElicitResult) -> Decision | None:
    """decline is a deny; accept gives the chosen decision; cancel (dismissed) or an answer
    outside the choices is no decision: the request stays with the approvers."""
    if result.action == "decline":
        return "deny"
    if result.action != "accept" or not result.content:
        return None
    choice: Any = result.content.get(FIELD)
    return CHOICES.get(choice) if isinstance(choice, str) else None


def asker(
    session: Any, request_id: types.RequestId | None, scrubber: Scrubber | None, approver: str
) -> Ask | None:
    """The approvals' `ask` hook for a call on this MCP session (a ServerSession), or None
    when the client cannot be asked (no form elicitation, or no channel back to it, as for a
    sessionless request): then the approval service alone decides, as for a gRPC caller."""
    if request_id is None or not session.can_send_request:
        return None
    if not supports_forms(session.client_capabilities):
        return None

    async def ask(pending: Pending) -> tuple[Decision, str] | None:
        result = await session.elicit_form(
            message_of(pending, scrubber), SCHEMA, related_request_id=request_id
        )
        decision = decision_of(result)
        return None if decision is None else (decision, approver)

    return ask
