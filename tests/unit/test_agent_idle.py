"""The agent's idle time in Hello (idle_ms): what supervisor replicas sharing a pod ask
before removing it, since none of them sees the others' calls. Calls count while in flight
and reset it when they end; Hello and Inspect (the supervisors' own probes) never do."""

from __future__ import annotations

import asyncio
from pathlib import Path

from stockade.agent.service import AgentService
from stockade.agent.v1 import agent_pb2


async def idle_ms(service: AgentService) -> int:
    hello = await service.hello()
    return int(hello.idle_ms)


async def test_idle_grows_and_probes_do_not_reset_it(tmp_path: Path) -> None:
    service = AgentService(tmp_path, max_output_bytes=1 << 20)
    await asyncio.sleep(0.05)
    first = await idle_ms(service)
    assert first >= 40
    await service.inspect(agent_pb2.InspectRequest())
    await asyncio.sleep(0.02)
    assert await idle_ms(service) > first


async def test_a_call_in_flight_is_not_idle_and_its_end_resets(tmp_path: Path) -> None:
    service = AgentService(tmp_path, max_output_bytes=1 << 20)
    (tmp_path / "sub").mkdir()
    await asyncio.sleep(0.3)
    before = await idle_ms(service)
    stream = service.watch_files(agent_pb2.WatchFilesRequest(path="sub"))
    await anext(stream)  # the watch is in place: a call in flight
    await asyncio.sleep(0.05)
    assert await idle_ms(service) == 0
    await stream.aclose()
    assert 0 < await idle_ms(service) + 1 <= before


async def test_an_invoke_resets_it(tmp_path: Path) -> None:
    service = AgentService(tmp_path, max_output_bytes=1 << 20)
    await asyncio.sleep(0.3)
    before = await idle_ms(service)
    request = agent_pb2.InvokeRequest(tool="list", arguments_json='{"path": "."}')
    await service.invoke(request)
    assert await idle_ms(service) < before
