"""ApprovalService: an approver watches the approval requests of its tenant, resolves
them, and lists what is pending and what is always allowed. A credential in a command is
shown to the approver as `[REDACTED]`."""

from __future__ import annotations

from collections.abc import AsyncIterator

from stockade.supervisor.fronts.grpc.convert import (
    bounded,
    decision_from_pb,
    event_to_pb,
    pending_to_pb,
)
from stockade.supervisor.fronts.grpc.interceptor import current_tenant
from stockade.supervisor.fronts.grpc.status import Context, mapped, mapped_stream
from stockade.supervisor.policy.approvals import ApprovalManager
from stockade.supervisor.policy.scrub.scrubber import Scrubber, scrubbed
from stockade.v1 import approval_pb2, approval_pb2_grpc


class ApprovalServicer(approval_pb2_grpc.ApprovalServiceServicer):
    def __init__(self, approvals: ApprovalManager, scrubber: Scrubber | None = None) -> None:
        self._approvals = approvals
        self.scrubber = scrubber

    @mapped_stream
    async def WatchApprovals(
        self, request: approval_pb2.WatchApprovalsRequest, context: Context
    ) -> AsyncIterator[approval_pb2.ApprovalEvent]:
        async for event in self._approvals.watch(current_tenant()):
            yield event_to_pb(event, self.scrubber)

    @mapped
    async def ResolveApproval(
        self, request: approval_pb2.ResolveApprovalRequest, context: Context
    ) -> approval_pb2.ResolveApprovalResponse:
        decision = decision_from_pb(request.decision)
        approver = bounded("approver", request.approver) or context.peer()
        await self._approvals.decide(request.id, decision, approver, tenant=current_tenant())
        return approval_pb2.ResolveApprovalResponse()

    @mapped
    async def ListApprovals(
        self, request: approval_pb2.ListApprovalsRequest, context: Context
    ) -> approval_pb2.ListApprovalsResponse:
        tenant = current_tenant()
        return approval_pb2.ListApprovalsResponse(
            pending=[pending_to_pb(p, self.scrubber) for p in self._approvals.pending(tenant)],
            always_allowed=[
                scrubbed(c, self.scrubber) for c in self._approvals.always_allowed(tenant)
            ],
            approvers=self._approvals.watchers_of(tenant),
        )
