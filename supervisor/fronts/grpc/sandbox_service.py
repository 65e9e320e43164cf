"""SandboxService: ensure, get, list, pause, resume and destroy a caller's sandboxes, and
report their isolation; snapshots, restores and forks are in snapshots.py. Every key a
request names is scoped to the caller's tenant. Ensure, pause, resume and destroy go through
the one lifecycle path (calls/lifecycle.py): one audit record each, front "grpc", the
caller's peer."""

from __future__ import annotations

import dataclasses

from stockade.supervisor.calls.lifecycle import Actor, Lifecycle
from stockade.supervisor.calls.sessions import SessionBook
from stockade.supervisor.fronts.grpc.convert import fill_pb, sandbox_to_pb, scoped
from stockade.supervisor.fronts.grpc.interceptor import current_tenant
from stockade.supervisor.fronts.grpc.snapshot_service import SnapshotCalls
from stockade.supervisor.fronts.grpc.status import Context, mapped
from stockade.supervisor.keys import shown, split
from stockade.supervisor.models import NetworkRequest
from stockade.supervisor.policy.scrub.scrubber import Scrubber
from stockade.supervisor.sandboxes.manager import SandboxManager
from stockade.v1 import sandbox_pb2, sandbox_pb2_grpc

FRONT = "grpc"


def actor(context: Context) -> Actor:
    """The caller of a lifecycle change through gRPC: its peer (as a tool call's record)."""
    return Actor(FRONT, context.peer())


class SandboxServicer(SnapshotCalls, sandbox_pb2_grpc.SandboxServiceServicer):
    def __init__(
        self,
        lifecycle: Lifecycle[SandboxManager],
        scrubber: Scrubber | None = None,
        sessions: SessionBook | None = None,
    ) -> None:
        """sessions: the pipeline's book of shell sessions (EndSession makes it forget)."""
        self._lifecycle = lifecycle
        self._sandboxes: SandboxManager = lifecycle.sandboxes
        self.scrubber = scrubber
        self._book = sessions or SessionBook()

    @mapped
    async def ListSessions(
        self, request: sandbox_pb2.ListSessionsRequest, context: Context
    ) -> sandbox_pb2.ListSessionsResponse:
        sessions = await self._lifecycle.sessions(scoped(request.key))
        return sandbox_pb2.ListSessionsResponse(
            sessions=[
                sandbox_pb2.ShellSession(
                    name=s.get("name", ""),
                    cwd=s.get("cwd", ""),
                    calls=s.get("calls", 0),
                    busy=s.get("busy", False),
                )
                for s in sessions
            ]
        )

    @mapped
    async def EndSession(
        self, request: sandbox_pb2.EndSessionRequest, context: Context
    ) -> sandbox_pb2.EndSessionResponse:
        key = scoped(request.key)
        ended = await self._lifecycle.end_session(actor(context), key, request.session, self._book)
        return sandbox_pb2.EndSessionResponse(ended=ended)

    @mapped
    async def EnsureSandbox(
        self, request: sandbox_pb2.EnsureSandboxRequest, context: Context
    ) -> sandbox_pb2.SandboxInfo:
        network = None
        if request.HasField("network"):
            network = NetworkRequest(request.network.mode, tuple(request.network.allow))
        key = scoped(request.key)
        await self._lifecycle.ensure(actor(context), key, network, request.profile or None)
        return sandbox_to_pb(await self._sandboxes.get(key))

    @mapped
    async def GetSandbox(
        self, request: sandbox_pb2.GetSandboxRequest, context: Context
    ) -> sandbox_pb2.SandboxInfo:
        return sandbox_to_pb(await self._sandboxes.get(scoped(request.key)))

    @mapped
    async def ListSandboxes(
        self, request: sandbox_pb2.ListSandboxesRequest, context: Context
    ) -> sandbox_pb2.ListSandboxesResponse:
        tenant = current_tenant()
        infos = [i for i in await self._sandboxes.list() if split(i.key)[0] == tenant]
        return sandbox_pb2.ListSandboxesResponse(sandboxes=[sandbox_to_pb(i) for i in infos])

    @mapped
    async def DestroySandbox(
        self, request: sandbox_pb2.DestroySandboxRequest, context: Context
    ) -> sandbox_pb2.DestroySandboxResponse:
        removed, deleted = await self._lifecycle.destroy(
            actor(context), scoped(request.key), delete_workspace=request.delete_workspace
        )
        return sandbox_pb2.DestroySandboxResponse(removed=removed, workspace_deleted=deleted)

    @mapped
    async def PauseSandbox(
        self, request: sandbox_pb2.PauseSandboxRequest, context: Context
    ) -> sandbox_pb2.PauseSandboxResponse:
        info, changed = await self._lifecycle.pause(actor(context), scoped(request.key))
        return sandbox_pb2.PauseSandboxResponse(sandbox=sandbox_to_pb(info), changed=changed)

    @mapped
    async def ResumeSandbox(
        self, request: sandbox_pb2.ResumeSandboxRequest, context: Context
    ) -> sandbox_pb2.ResumeSandboxResponse:
        info, changed = await self._lifecycle.resume(actor(context), scoped(request.key))
        return sandbox_pb2.ResumeSandboxResponse(sandbox=sandbox_to_pb(info), changed=changed)

    @mapped
    async def InspectIsolation(
        self, request: sandbox_pb2.InspectIsolationRequest, context: Context
    ) -> sandbox_pb2.IsolationReport:
        report = await self._sandboxes.inspect_isolation(scoped(request.key))
        report = dataclasses.replace(report, key=shown(report.key))
        return fill_pb(sandbox_pb2.IsolationReport(), report)
