"""AuditService: the audit records of the caller's tenant, filtered."""

from __future__ import annotations

from stockade.supervisor import errors
from stockade.supervisor.fronts.grpc.convert import audit_to_pb
from stockade.supervisor.fronts.grpc.interceptor import current_tenant
from stockade.supervisor.fronts.grpc.status import Context, mapped
from stockade.supervisor.keys import scope, shown
from stockade.supervisor.observe.audit import AuditLog, AuditQuery
from stockade.supervisor.policy.scrub.scrubber import Scrubber
from stockade.supervisor.tools.catalog import ALIASES
from stockade.v1 import audit_pb2, audit_pb2_grpc


class AuditServicer(audit_pb2_grpc.AuditServiceServicer):
    def __init__(self, audit: AuditLog | None, scrubber: Scrubber | None = None) -> None:
        self._audit = audit
        self.scrubber = scrubber

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
