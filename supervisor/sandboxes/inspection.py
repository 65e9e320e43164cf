"""InspectIsolation's report: a sandbox's isolation from inside (raw facts its agent reads,
through no tool and no policy: nothing the caller says reaches the sandbox) and from outside
(the engine)."""

from __future__ import annotations

import asyncio
import os

from stockade.supervisor.engines import isolation
from stockade.supervisor.engines.backends.base import ContainerBackend
from stockade.supervisor.errors import SandboxNotFound
from stockade.supervisor.keys import shown
from stockade.supervisor.sandboxes.lease import Lease

INSPECT_TIMEOUT_S = 30.0


async def isolation_report(lease: Lease, backend: ContainerBackend) -> isolation.IsolationReport:
    probe = f"/.stockade-write-probe-{os.urandom(6).hex()}"
    facts = await lease.inspect(
        list(isolation.FILES), list(isolation.LINKS), probe, INSPECT_TIMEOUT_S
    )
    container = lease.sandbox.info.id
    view = await asyncio.to_thread(backend.security_view, container)
    if view is None:
        raise SandboxNotFound(f"the container of sandbox {shown(lease.key)!r} is gone")
    runtime = await asyncio.to_thread(backend.runtime_facts)
    known = await asyncio.to_thread(backend.runtimes)
    inside = isolation.InsideFacts(
        facts.files, facts.links, facts.root_read_only, facts.write_probe_error
    )
    return isolation.IsolationReport(
        key=lease.key,
        container_id=container,
        engine=backend.engine,
        inside=isolation.inside_view(inside),
        outside=view,
        namespaces=isolation.namespaces(facts.links, isolation.host_namespaces()),
        runtime=isolation.runtime_info(runtime, view.runtime, known),
    )
