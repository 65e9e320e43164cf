"""AuditService: the audit records of the caller's tenant, filtered; and ReplayPolicy, the
recorded calls through a candidate config (operators only: calls/replay.py)."""

from __future__ import annotations

import asyncio
import time

from google.protobuf.timestamp_pb2 import Timestamp

from stockade.supervisor import errors
from stockade.supervisor.calls.replay import ReplayReport, replay_candidate
from stockade.supervisor.fronts.grpc.convert import audit_to_pb
from stockade.supervisor.fronts.grpc.interceptor import current_tenant
from stockade.supervisor.fronts.grpc.status import Context, mapped
from stockade.supervisor.keys import scope, shown
from stockade.supervisor.observe.audit import AuditLog, AuditQuery, ScanQuery
from stockade.supervisor.policy.approvals import AllowAlways
from stockade.supervisor.policy.scrub.scrubber import Scrubber
from stockade.supervisor.tools.catalog import ALIASES
from stockade.v1 import audit_pb2, audit_pb2_grpc

DAY_S = 86400.0


class AuditServicer(audit_pb2_grpc.AuditServiceServicer):
    def __init__(
        self,
        audit: AuditLog | None,
        scrubber: Scrubber | None = None,
        operators: frozenset[str] | None = None,
        always: AllowAlways | None = None,
        custom_tools: tuple[str, ...] = (),
    ) -> None:
        """operators: the tenants who may replay (console.operators); None: anyone (auth
        off). always: the allow-always commands in force, and custom_tools this server's
        custom tools, for replay."""
        self._audit = audit
        self.scrubber = scrubber
        self._operators = operators
        self._always = always
        self._custom_tools = custom_tools

    @mapped
    async def ListAudit(
        self, request: audit_pb2.ListAuditRequest, context: Context
    ) -> audit_pb2.ListAuditResponse:
        if self._audit is None:
            raise errors.ConfigError("the audit log is off (audit.enabled = false)")
        since = request.since.seconds + request.since.nanos / 1e9  # any value: no datetime
        tenant = current_tenant()
        query = AuditQuery(
            tenant=tenant,
            sandbox_key=shown(scope(tenant, request.sandbox_key)) if request.sandbox_key else "",
            tool=ALIASES.get(request.tool, request.tool),  # records hold the tool's own name
            agent_id=request.agent_id,
            since=since,
            limit=request.limit or 100,
            errors_only=request.errors_only,
        )
        records = await self._audit.query(query)
        return audit_pb2.ListAuditResponse(records=[audit_to_pb(r) for r in records])

    @mapped
    async def ReplayPolicy(
        self, request: audit_pb2.ReplayPolicyRequest, context: Context
    ) -> audit_pb2.ReplayPolicyResponse:
        if self._audit is None:
            raise errors.ConfigError("the audit log is off (audit.enabled = false)")
        caller = current_tenant()
        if self._operators is not None and caller not in self._operators:
            raise errors.PolicyDenied(
                "ReplayPolicy is for operators (console.operators): a candidate's guard "
                "patterns run in the supervisor"
            )
        since = request.since.seconds + request.since.nanos / 1e9
        query = ScanQuery(
            since=since if request.HasField("since") else time.time() - DAY_S,
            tenant=None if request.all_tenants else request.tenant or caller,
            sandbox_key=request.sandbox_key,
            limit=request.max_records,
        )
        report, truncated = await asyncio.to_thread(
            replay_candidate,
            self._audit,
            request.candidate_toml,
            query,
            self._always,
            self._custom_tools,
        )
        return _replay_to_pb(report, truncated)


def _replay_to_pb(report: ReplayReport, truncated: bool) -> audit_pb2.ReplayPolicyResponse:
    changes = []
    for change in report.ordered():
        examples = []
        for e in change.examples:
            when = Timestamp()
            when.FromNanoseconds(int(e.time * 1e9))
            examples.append(
                audit_pb2.ReplayExample(
                    id=e.id,
                    time=when,
                    tenant=e.tenant,
                    sandbox_key=e.sandbox_key,
                    tool=e.tool,
                    arguments_json=e.arguments_json,
                    was_rule=e.was,
                )
            )
        changes.append(
            audit_pb2.ReplayChange(
                was=change.was,
                now=change.now,
                rule=change.rule,
                count=change.count,
                examples=examples,
            )
        )
    return audit_pb2.ReplayPolicyResponse(
        replayed=report.replayed, unchanged=report.unchanged, skipped=dict(report.skipped),
        changes=changes, truncated=truncated,
    )  # fmt: skip
