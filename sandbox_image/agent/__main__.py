"""Entry point: python3 -P -m stockade.agent --socket PATH --workspace DIR (a container on the
supervisor's host), or --listen HOST:PORT --tls-dir DIR (a pod: mutual TLS, tls.py)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import cast

AGENT_IDS = "65533:65533"
"""identity.AGENT_UID's (identity.py is imported once the flags are read: it loads asyncio)."""


def main() -> None:
    parser = argparse.ArgumentParser(prog="stockade.agent")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--socket", type=Path, help="unix socket to serve on")
    where.add_argument(
        "--listen", metavar="HOST:PORT", help="TCP address to serve on, with mutual TLS only"
    )
    parser.add_argument(
        "--tls-dir",
        type=Path,
        help="folder of ca.crt, tls.crt and tls.key (required with --listen)",
    )
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
        default=AGENT_IDS,
        help="UID:GID the agent keeps as real ids when started as root",
    )
    ns = parser.parse_args()
    if ns.listen is None:
        # on a unix socket nothing speaks TLS: Python's ssl (which asyncio would load for
        # its TLS transports) is never needed, and would cost ~1 MiB and ~3 ms a start
        cast("dict[str, object]", sys.modules)["ssl"] = None
    import asyncio

    from stockade.agent import identity, strays
    from stockade.agent.server import Listen, serve

    endpoint: Path | Listen = ns.socket
    if ns.listen is not None:
        if ns.tls_dir is None:
            parser.error("--listen needs --tls-dir: the agent never serves TCP without mutual TLS")
        from stockade.agent import tls  # grpc: loaded only for TCP

        try:
            host, port = tls.parse_listen(ns.listen)
        except ValueError as exc:
            parser.error(str(exc))
        try:
            endpoint = Listen(host, port, tls.server_credentials(ns.tls_dir))
        except OSError as exc:
            parser.exit(1, f"{parser.prog}: error: {exc}\n")
    elif ns.tls_dir is not None:
        parser.error("--tls-dir goes with --listen (a unix socket has no TLS)")
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
            endpoint,
            ns.workspace,
            max_output_bytes=ns.max_output_bytes,
            max_processes=ns.max_processes,
            process_log_bytes=ns.process_log_bytes,
        )
    )


if __name__ == "__main__":
    main()
