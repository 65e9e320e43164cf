"""ToolService: the tools a caller may use, a call (one reply or a stream of events), and
an interactive process."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

from stockade.supervisor import errors
from stockade.supervisor.calls.interact import Interaction
from stockade.supervisor.calls.pipeline import HostPolicy, ToolPipeline
from stockade.supervisor.fronts.grpc.convert import (
    call_from_pb,
    context_from_pb,
    format_from_pb,
    interact_from_pb,
    interact_inputs,
    result_to_pb,
    scoped,
    tool_event_to_pb,
    tool_to_pb,
    traceparent_of,
)
from stockade.supervisor.fronts.grpc.status import Context, mapped, mapped_stream
from stockade.supervisor.policy.approvals import Pending
from stockade.v1 import tool_pb2, tool_pb2_grpc


class ToolServicer(tool_pb2_grpc.ToolServiceServicer):
    def __init__(
        self, pipeline: ToolPipeline, policy: HostPolicy, interaction: Interaction
    ) -> None:
        self._pipeline = pipeline
        self._policy = policy
        self._interaction = interaction
        self.scrubber = policy.scrubber

    @mapped
    async def ListTools(
        self, request: tool_pb2.ListToolsRequest, context: Context
    ) -> tool_pb2.ListToolsResponse:
        fmt = format_from_pb(request.format)
        catalog = self._policy.catalog
        allowed = self._policy.tools.allowed_tools(context_from_pb(request.context))
        specs = [tool_to_pb(t, fmt, catalog.aliases_of(t.name)) for t in allowed]
        return tool_pb2.ListToolsResponse(tools=specs)

    @mapped
    async def CallTool(
        self, request: tool_pb2.CallToolRequest, context: Context
    ) -> tool_pb2.ToolResult:
        if request.caller_approves:
            raise errors.InvalidRequest(
                "caller_approves needs CallToolStream (its approval_pending event names the "
                "approval to resolve)"
            )
        call = call_from_pb(request, traceparent_of(context))
        result = await self._pipeline.call(call, caller=context.peer())
        return result_to_pb(result)

    @mapped_stream
    async def CallToolStream(
        self, request: tool_pb2.CallToolRequest, context: Context
    ) -> AsyncIterator[tool_pb2.ToolEvent]:
        call = call_from_pb(request, traceparent_of(context))
        ask = _answered_by_caller if request.caller_approves else None
        stream = self._pipeline.call_stream(call, caller=context.peer(), ask=ask)
        async for event in stream:
            yield tool_event_to_pb(event)

    @mapped_stream
    async def Interact(
        self, request_iterator: AsyncIterator[tool_pb2.InteractInput], context: Context
    ) -> AsyncIterator[tool_pb2.ToolEvent]:
        first = await anext(aiter(request_iterator), None)
        if first is None or first.WhichOneof("input") != "start":
            raise errors.InvalidRequest("an Interact call starts with a 'start' message")
        request = interact_from_pb(first.start)
        request = dataclasses.replace(request, sandbox_key=scoped(request.sandbox_key))
        events = self._interaction.run(
            request, interact_inputs(request_iterator), caller=context.peer()
        )
        async for event in events:
            yield tool_event_to_pb(event)


async def _answered_by_caller(pending: Pending) -> None:
    """The `ask` of a streamed call whose caller resolves its approvals itself
    (caller_approves): the caller counts as a connected approver, and its answer comes
    through ResolveApproval, so this waits (until the approval is decided, times out, or the
    stream ends, which cancel it) and never answers."""
    await asyncio.Event().wait()
