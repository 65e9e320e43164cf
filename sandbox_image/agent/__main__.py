"""Entry point: python3 -m stockade.agent --socket PATH --workspace DIR."""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

from stockade.agent import identity, strays
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
    parser.add_argument(
        "--user", default="", help="UID:GID of the sandbox user, who runs every command"
    )
    parser.add_argument(
        "--agent-user",
        default=f"{identity.AGENT_UID}:{identity.AGENT_UID}",
        help="UID:GID the agent keeps as real ids when started as root",
    )
    ns = parser.parse_args()
    if ns.user:
        try:
            identity.take(*identity.parse(ns.user), identity.parse(ns.agent_user))
        except ValueError as exc:
            parser.error(str(exc))
    else:
        identity.take(os.getuid(), os.getgid())
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


if __name__ == "__main__":
    main()
