"""Entry point: python3 -m stockade.agent --socket PATH --workspace DIR."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

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
