"""Entry point: python3 -m stockade.agent --socket PATH --workspace DIR."""

from __future__ import annotations

import argparse
import asyncio
import ctypes
from pathlib import Path

from stockade.agent import strays
from stockade.agent.server import serve


def main() -> None:
    parser = argparse.ArgumentParser(prog="stockade.agent")
    parser.add_argument("--socket", type=Path, required=True, help="unix socket to serve on")
    parser.add_argument("--workspace", type=Path, default=Path("/workspace"))
    parser.add_argument("--max-output-bytes", type=int, default=10 * 1024 * 1024)
    parser.add_argument("--max-processes", type=int, default=5, help="running background processes")
    parser.add_argument(
        "--process-log-bytes", type=int, default=1 << 20, help="log kept per process"
    )
    ns = parser.parse_args()
    _not_dumpable()
    strays.enable()
    asyncio.run(
        serve(
            ns.socket,
            ns.workspace,
            max_output_bytes=ns.max_output_bytes,
            max_processes=ns.max_processes,
            process_log_bytes=ns.process_log_bytes,
        )
    )


PR_SET_DUMPABLE = 4


def _not_dumpable() -> None:
    """Sandbox code runs as the agent's uid: without this it could ptrace the agent, read its
    memory or take its descriptors through /proc. Commands the agent starts are dumpable
    again (execve resets the flag), so their own tools (gdb, strace) still work."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


if __name__ == "__main__":
    main()
