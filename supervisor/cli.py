"""The `stockade` command: the server side (serve, image build, doctor) and client
commands that use only the public client API (exec, call, ls, rm, tools)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import shlex
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stockade.client import Stockade, StockadeError

EXIT_TIMEOUT = 124
EXIT_CLIENT_ERROR = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stockade", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the supervisor in the foreground")
    serve.add_argument("--config", type=Path, help="TOML config file")
    serve.add_argument("--listen", help="host:port or unix:/path (default 127.0.0.1:50051)")
    serve.add_argument("--engine", choices=["podman", "docker"])
    serve.add_argument("--state-dir", help="default /var/lib/stockade")

    image = sub.add_parser("image", help="sandbox image")
    image_sub = image.add_subparsers(dest="image_command", required=True)
    build = image_sub.add_parser("build", help="build the sandbox image for an engine")
    build.add_argument("--engine", choices=["podman", "docker"], default="podman")
    build.add_argument("--force", action="store_true", help="rebuild even if up to date")

    doctor = sub.add_parser("doctor", help="check engine, runtime, cgroups and image")
    doctor.add_argument("--config", type=Path)
    doctor.add_argument("--engine", choices=["podman", "docker"])

    client = argparse.ArgumentParser(add_help=False)
    client.add_argument("--server", help="supervisor address (default $STOCKADE_ADDR)")
    run = sub.add_parser("exec", parents=[client], help="run a command in a sandbox")
    run.add_argument("--timeout", type=float, help="seconds")
    run.add_argument("--workdir")
    run.add_argument("key")
    run.add_argument("argv", nargs=argparse.REMAINDER, help="-- COMMAND [ARG...]")
    call = sub.add_parser("call", parents=[client], help="call a tool; print the ToolResult")
    call.add_argument("key")
    call.add_argument("tool")
    call.add_argument("arguments", nargs="?", default="", help="JSON object")
    sub.add_parser("ls", parents=[client], help="list sandboxes")
    rm = sub.add_parser("rm", parents=[client], help="destroy a sandbox's container")
    rm.add_argument("--delete-workspace", action="store_true")
    rm.add_argument("key")
    sub.add_parser("tools", parents=[client], help="list tools")
    return parser


def main(argv: list[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    handler = _COMMANDS[ns.command]
    try:
        return handler(ns)
    except StockadeError as exc:
        print(f"stockade: {exc}", file=sys.stderr)
        return EXIT_CLIENT_ERROR


def _serve(ns: argparse.Namespace) -> int:
    from stockade.supervisor.config import load_config
    from stockade.supervisor.errors import StockadeError as ServerError

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    overrides = {
        "listen": ns.listen,
        "engine.kind": ns.engine,
        "state_dir": ns.state_dir,
    }
    try:
        config = load_config(ns.config, {k: v for k, v in overrides.items() if v})
        asyncio.run(_serve_until_signal(config))
    except ServerError as exc:
        print(f"stockade serve: {exc}", file=sys.stderr)
        return 1
    return 0


async def _serve_until_signal(config: Any) -> None:
    from stockade.supervisor import app

    supervisor = await app.start(config)
    where = config.listen if supervisor.server.port == 0 else _with_port(config.listen, supervisor)
    print(
        f"stockade: serving on {where} (engine {config.engine.kind}, "
        f"image {supervisor.sandboxes.image}, state {config.state_dir})",
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    print("stockade: shutting down; sandboxes keep running for the next start", flush=True)
    await supervisor.stop()


def _with_port(listen: str, supervisor: Any) -> str:
    host = listen.rsplit(":", 1)[0]
    return f"{host}:{supervisor.server.port}"


def _image(ns: argparse.Namespace) -> int:
    from stockade.supervisor.image import ImageBuildError, build_image, default_cache_dir

    try:
        ref = build_image(ns.engine, cache_dir=default_cache_dir(), force=ns.force)
    except ImageBuildError as exc:
        print(f"stockade image build: {exc}", file=sys.stderr)
        return 1
    print(ref)
    return 0


def _doctor(ns: argparse.Namespace) -> int:
    from stockade.supervisor.config import load_config
    from stockade.supervisor.doctor import run_checks

    config = load_config(ns.config, {"engine.kind": ns.engine} if ns.engine else None)
    ok = True
    for check in run_checks(config):
        mark = "ok  " if check.ok else "FAIL"
        print(f"[{mark}] {check.name}: {check.detail}")
        if not check.ok:
            ok = False
            print(f"       fix: {check.fix}")
    return 0 if ok else 1


def _client(ns: argparse.Namespace) -> Stockade:
    return Stockade(ns.server)


def _exec(ns: argparse.Namespace) -> int:
    argv = ns.argv[1:] if ns.argv[:1] == ["--"] else ns.argv
    if not argv:
        print("stockade exec: give a command after --", file=sys.stderr)
        return EXIT_CLIENT_ERROR
    command = argv[0] if len(argv) == 1 else shlex.join(argv)
    with _client(ns) as client:
        result = client.sandbox(ns.key).exec(command, timeout=ns.timeout, workdir=ns.workdir)
    sys.stdout.write(result.stdout)
    sys.stdout.flush()
    sys.stderr.write(result.stderr)
    if result.exit_code is None or result.error_code == "TIMEOUT":
        print(f"stockade: {result.error_code}: {result.error_message}", file=sys.stderr)
        return EXIT_TIMEOUT if result.error_code == "TIMEOUT" else 1
    return result.exit_code


def _call(ns: argparse.Namespace) -> int:
    with _client(ns) as client:
        result = client.call(ns.key, ns.tool, ns.arguments)
    print(json.dumps(result.to_dict(), indent=2, ensure_ascii=False))
    return 1 if result.is_error else 0


def _ls(ns: argparse.Namespace) -> int:
    with _client(ns) as client:
        sandboxes = client.list_sandboxes()
    print(f"{'KEY':<24} {'STATE':<8} {'ENGINE':<7} {'CONTAINER':<14} WORKSPACE")
    for s in sandboxes:
        cid = s.container_id[:12]
        print(f"{s.key:<24} {s.state:<8} {s.engine:<7} {cid:<14} {s.workspace_path}")
    return 0


def _rm(ns: argparse.Namespace) -> int:
    with _client(ns) as client:
        removed = client.destroy_sandbox(ns.key, delete_workspace=ns.delete_workspace)
    print(f"{ns.key}: {'container removed' if removed else 'no container'}", end="")
    print("; workspace deleted" if ns.delete_workspace else "; workspace kept")
    return 0


def _tools(ns: argparse.Namespace) -> int:
    with _client(ns) as client:
        tools = client.list_tools()
    for tool in tools:
        print(f"{tool.name:<12} {tool.group:<8} {tool.description}")
    return 0


_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "serve": _serve,
    "image": _image,
    "doctor": _doctor,
    "exec": _exec,
    "call": _call,
    "ls": _ls,
    "rm": _rm,
    "tools": _tools,
}

if __name__ == "__main__":
    sys.exit(main())
