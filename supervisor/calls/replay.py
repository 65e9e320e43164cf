"""Policy replay: the recorded tool calls of the audit log run through a candidate config's
decisions (the pure ones of the call path: tool policy, argument validation, the guard,
the approval rules and the per-key rate limit), and what would change (docs/audit.md).

No sandbox is touched and nothing is asked of an approver: a call is `allowed`, `refused`
or sent to `approval` (the decision before an approver would answer). What a call did when
it was recorded is read from its record (`recorded`); what the candidate would do is
decided again from its tool, arguments and caller (`Replayer.decide`). A record the
candidate cannot judge as the supervisor did is skipped, with its reason counted:
arguments cut at audit.max_arguments_bytes, a honeytoken refusal, a stream cap, records that
are no tool call (egress, housekeeping, lifecycle actions, transfers, watches, refusals).

What replay cannot see: the secrets the scrubber took out of recorded arguments (the guard
judges the command with them redacted), honeytokens, the calls-in-flight caps, and the
approvers' answers."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from stockade.supervisor import errors
from stockade.supervisor.calls import previews
from stockade.supervisor.calls.pipeline import command_of, parse_arguments, where_of
from stockade.supervisor.config import Config, config_from_toml
from stockade.supervisor.config.policy import FILE_APPROVAL_TOOLS
from stockade.supervisor.errors import ConfigError
from stockade.supervisor.models import CallContext, ErrorCode
from stockade.supervisor.observe.audit import AuditLog, AuditRecord, ScanQuery
from stockade.supervisor.policy.approvals import AllowAlways, ApprovalManager
from stockade.supervisor.policy.guard import Guard, GuardConfigError, GuardRule
from stockade.supervisor.policy.limits import KeyLimiter, LimitExceeded
from stockade.supervisor.policy.tool_policy import ALLOWED, PolicyEngine
from stockade.supervisor.sandboxes.manager import WORKSPACE
from stockade.supervisor.tools.catalog import ALIASES, Catalog
from stockade.supervisor.tools.schemas import ArgumentError, validate_arguments

Outcome = Literal["allowed", "refused", "approval"]
ASKED = frozenset({"no-approver", "allow-once", "allow-always", "deny", "timeout", "withdrawn"})
"""The approval column of a call that was sent to approval (policy/approvals.py Outcome)."""
MAX_EXAMPLES = 3
GUARD_CACHE = 65_536
"""Guard verdicts kept per replay, by (command, workdir, env): a day of calls repeats its
commands, and parsing one is the dearest step."""


@dataclass(frozen=True)
class Decision:
    outcome: Outcome
    rule: str
    """What decided: "allowed"; a tool policy step ("tools.deny"); "guard.RULE";
    "approvals.MODE" or "guard.RULE" (for approval); "arguments"; "unknown-tool";
    "limits.rate"."""


@dataclass(frozen=True)
class Example:
    id: int
    time: float
    tenant: str
    sandbox_key: str
    tool: str
    arguments_json: str
    was: str
    """The rule that decided when the call was recorded."""


@dataclass
class Change:
    was: Outcome
    now: Outcome
    rule: str
    """The rule that decides now (for a call now allowed: the one that decided then)."""
    count: int = 0
    examples: list[Example] = field(default_factory=list)


@dataclass
class ReplayReport:
    replayed: int = 0
    unchanged: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    changes: dict[tuple[str, str, str], Change] = field(default_factory=dict)
    changed_ids: dict[tuple[str, str, str], list[int]] = field(default_factory=dict)
    """Every changed record's id by change (the examples are a few of them), if keep_ids."""
    keep_ids: bool = True

    def add(self, record: AuditRecord, was: Decision, now: Decision) -> None:
        self.replayed += 1
        if was.outcome == now.outcome:
            self.unchanged += 1
            return
        rule = was.rule if now.outcome == "allowed" else now.rule
        key = (was.outcome, now.outcome, rule)
        change = self.changes.setdefault(key, Change(was.outcome, now.outcome, rule))
        change.count += 1
        if self.keep_ids:
            self.changed_ids.setdefault(key, []).append(record.id)
        if len(change.examples) < MAX_EXAMPLES:
            change.examples.append(
                Example(
                    record.id,
                    record.time,
                    record.tenant,
                    record.sandbox_key,
                    record.tool,
                    record.arguments_json[:512],
                    was.rule,
                )
            )

    def as_json(self) -> dict[str, Any]:
        return {
            "replayed": self.replayed,
            "unchanged": self.unchanged,
            "skipped": dict(sorted(self.skipped.items())),
            "changes": [
                {
                    "was": c.was,
                    "now": c.now,
                    "rule": c.rule,
                    "count": c.count,
                    "examples": [e.__dict__ for e in c.examples],
                }
                for c in self.ordered()
            ],
        }

    def ordered(self) -> list[Change]:
        """Most calls first."""
        return sorted(self.changes.values(), key=lambda c: (-c.count, c.now, c.rule))


def recorded(record: AuditRecord) -> Decision | str:
    """What the call's record says was decided; a string: why it cannot be replayed."""
    code, step = record.error_code, record.policy_step
    if not record.front:
        return "not a tool call"
    if step == "honeytoken":
        return "honeytoken"
    if step.startswith("limits."):
        return "stream or watch cap"
    if code == ErrorCode.NOT_FOUND and not step:
        return Decision("refused", "unknown-tool")
    if step and step != ALLOWED:
        return Decision("refused", step)
    if code == ErrorCode.INVALID_ARGS:
        return Decision("refused", "arguments")
    if code == ErrorCode.PERMISSION_DENIED and record.guard_rule:
        return Decision("refused", f"guard.{record.guard_rule}")
    if record.approval in ASKED:
        rule = f"guard.{record.guard_rule}" if record.guard_rule else "approvals"
        if record.tool in FILE_APPROVAL_TOOLS:
            rule = "approvals.files"
        return Decision("approval", rule)
    if code == ErrorCode.RATE_LIMITED:
        return Decision("refused", "limits.rate")
    return Decision("allowed", ALLOWED)


class Replayer:
    """A candidate config's decisions over recorded calls, in their order (the rate limit
    counts by their recorded times)."""

    def __init__(
        self,
        config: Config,
        always: AllowAlways | None = None,
        recorded_tools: Iterable[str] = (),
    ) -> None:
        """always: the allow-always commands in force (None: none). recorded_tools: the
        custom tools of the config the calls were recorded under (a call of one the
        candidate drops is replayed, as now unknown)."""
        self._catalog = Catalog(config.custom_tools)
        self._tools_known = frozenset(
            [*Catalog(()).tools, *ALIASES, *self._catalog.tools, *recorded_tools]
        )
        self._tools = PolicyEngine(config, self._catalog)
        self._guard = _guard(config)
        self._approvals = ApprovalManager(config.approvals, config.agents, always or FixedAlways())
        self._now = 0.0
        self._limiter = KeyLimiter(config.limits, clock=lambda: self._now)
        self._verdicts: dict[tuple[str, str | None, str], tuple[str, str]] = {}

    def is_call(self, record: AuditRecord) -> bool:
        """Whether a record is a tool call's: a tool of either config, or a call of an unknown
        tool refused as such (not a lifecycle action, transfer, watch, refusal or alarm)."""
        if record.tool in self._tools_known:
            return True
        return record.error_code == ErrorCode.NOT_FOUND and not record.policy_step

    def decide(self, record: AuditRecord) -> Decision | str:
        """The candidate's decision on a recorded call; a string: why it cannot be judged."""
        spec = self._catalog.resolve(record.tool)
        if spec is None:
            return Decision("refused", "unknown-tool")
        decision = self._tools.decide(spec.name, _context(record))
        if not decision.allowed:
            return Decision("refused", decision.step)
        try:
            args = parse_arguments(record.arguments_json)
        except ValueError:
            if record.error_code == ErrorCode.INVALID_ARGS:
                return Decision("refused", "arguments")
            return "arguments not recorded whole"
        try:
            validate_arguments(spec.parameters, args)
            command = command_of(spec, args)
        except (ArgumentError, KeyError):
            return Decision("refused", "arguments")
        if command is not None:
            asked = self._check_command(record, command, where_of(spec, args))
            if asked is not None and asked.outcome == "refused":
                return asked
        elif spec.custom is None and spec.name in FILE_APPROVAL_TOOLS:
            change = previews.change_of(spec.name, args)
            reason = self._approvals.reason_to_ask_file(spec.name, change, record.tenant)
            asked = None if reason is None else Decision("approval", "approvals.files")
        else:
            asked = None
        self._now = record.time
        try:
            self._limiter.take(_scoped(record))
        except LimitExceeded:
            return Decision("refused", "limits.rate")
        return asked or Decision("allowed", ALLOWED)

    def _check_command(
        self, record: AuditRecord, command: str, where: dict[str, Any]
    ) -> Decision | None:
        """The guard's and the approval rules' say on a command: refused, approval or None."""
        if self._guard is not None:
            action, rule = self._verdict(command, where)
            if action == "deny":
                return Decision("refused", f"guard.{rule}")
            if action == "ask":
                return Decision("approval", f"guard.{rule}")
        reason = self._approvals.reason_to_ask(record.agent_id, command, record.tenant)
        return None if reason is None else Decision("approval", "approvals")

    def _verdict(self, command: str, where: dict[str, Any]) -> tuple[str, str]:
        env = json.dumps(where["env"], sort_keys=True) if where["env"] else ""
        key = (command, where["workdir"], env)
        found = self._verdicts.get(key)
        if found is None:
            assert self._guard is not None
            verdict = self._guard.check(command, **where)
            found = (verdict.action, verdict.rule or "")
            if len(self._verdicts) >= GUARD_CACHE:
                self._verdicts.clear()
            self._verdicts[key] = found
        return found


def replay(
    records: Iterable[AuditRecord], candidate: Replayer, *, keep_ids: bool = True
) -> ReplayReport:
    """Every record through the candidate, against what its record says was decided."""
    report = ReplayReport(keep_ids=keep_ids)
    for record in records:
        if not candidate.is_call(record):
            report.skipped["not a tool call"] += 1
            continue
        was = recorded(record)
        if isinstance(was, str):
            report.skipped[was] += 1
            continue
        now = candidate.decide(record)
        if isinstance(now, str):
            report.skipped[now] += 1
            continue
        report.add(record, was, now)
    return report


MAX_CANDIDATE_BYTES = 1 << 20
"""The largest candidate config a caller may send (ReplayPolicy)."""
MAX_RECORDS = 1_000_000
"""The most records one ReplayPolicy replays (about a minute of one core's time)."""


def replay_candidate(
    audit: AuditLog,
    candidate_toml: str,
    query: ScanQuery,
    always: AllowAlways | None = None,
    recorded_tools: Iterable[str] = (),
) -> tuple[ReplayReport, bool]:
    """ReplayPolicy's work, blocking (call it in a thread): the candidate's TOML checked and
    loaded, the records read (at most query.limit, MAX_RECORDS), replayed; True when more
    records were left."""
    if len(candidate_toml.encode("utf-8", "surrogatepass")) > MAX_CANDIDATE_BYTES:
        raise errors.InvalidRequest(f"the candidate config is over {MAX_CANDIDATE_BYTES >> 20} MiB")
    try:
        replayer = Replayer(config_from_toml(candidate_toml), always, recorded_tools)
    except errors.ConfigError as exc:
        raise errors.InvalidRequest(str(exc)) from exc
    limit = min(query.limit or MAX_RECORDS, MAX_RECORDS)
    with audit.scan(replace(query, limit=limit + 1)) as records:
        report = replay(itertools.islice(records, limit), replayer, keep_ids=False)
        return report, next(records, None) is not None


def _guard(config: Config) -> Guard | None:
    if not config.guard.enabled:
        return None
    rules = [GuardRule(r.name, r.pattern, r.reason, r.checkpoint) for r in config.guard.rules]
    try:
        return Guard(rules, on_parse_error=config.guard.on_parse_error, workspace=WORKSPACE)
    except GuardConfigError as exc:
        raise ConfigError(str(exc)) from exc


def _context(record: AuditRecord) -> CallContext:
    """The caller's context as policy saw it: agent and provider, and what context_json
    kept (calls/recorder.py context_json)."""
    extra: dict[str, Any] = {}
    if record.context_json:
        try:
            loaded = json.loads(record.context_json)
        except ValueError:
            loaded = {}
        if isinstance(loaded, dict):
            extra = {
                k: v
                for k, v in loaded.items()
                if (k in ("channel", "chat_id", "peer_kind") and isinstance(v, str))
                or (k == "subagent_depth" and isinstance(v, int))
            }
    return CallContext(agent_id=record.agent_id, provider=record.provider, **extra)


def _scoped(record: AuditRecord) -> str:
    """The key the rate limit counted the call under (tenant-scoped, as keys.scope makes it)."""
    return f"{record.tenant}\0{record.sandbox_key}" if record.tenant else record.sandbox_key


class FixedAlways(AllowAlways):
    """The commands approved with allow-always as a replay reads them from the store, once:
    (tenant, command) pairs."""

    def __init__(self, approved: Iterable[tuple[str, str]] = ()) -> None:  # no database
        self._commands: set[tuple[str, str]] = {(str(t), str(c)) for t, c in approved}
