"""The `stockade` command: the server side (serve, image build, doctor) and client
commands that use only the public client API (exec, call, ls, rm, snapshot, tools, ...)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import shlex
import signal
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from stockade.client import (
    TLS,
    CallContext,
    InvalidArgument,
    Stockade,
    StockadeError,
)
from stockade.supervisor.cli import terminal
from stockade.supervisor.cli.parsing import parse
from stockade.supervisor.text import printable

EXIT_TIMEOUT = 124
EXIT_CLIENT_ERROR = 2


def main(argv: list[str] | None = None) -> int:
    ns = parse(sys.argv[1:] if argv is None else argv)
    handler = _COMMANDS[ns.command]
    try:
        return handler(ns)
    except StockadeError as exc:
        print(f"stockade: {exc}", file=sys.stderr)
        return EXIT_CLIENT_ERROR


def _serve(ns: argparse.Namespace) -> int:
    from stockade.supervisor.config import load_config
    from stockade.supervisor.errors import StockadeError as ServerError
    from stockade.supervisor.observe.telemetry import setup_logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    overrides = {
        "listen": ns.listen,
        "engine.kind": ns.engine,
        "state_dir": ns.state_dir,
    }
    chosen: dict[str, Any] = {k: v for k, v in overrides.items() if v}
    if ns.no_auth:
        chosen["auth.enabled"] = False
    try:
        config = load_config(ns.config, chosen)
        setup_logging(config.observability.log_format)
        asyncio.run(_serve_until_signal(config, lambda: load_config(ns.config, chosen)))
    except ServerError as exc:
        print(f"stockade serve: {exc}", file=sys.stderr)
        return 1
    return 0


async def _serve_until_signal(config: Any, load: Callable[[], Any]) -> None:
    from stockade.supervisor import app
    from stockade.supervisor.cli.reloading import Reloadable, Reloader
    from stockade.supervisor.observe import waits

    loop = asyncio.get_running_loop()
    early: list[bool] = []  # a SIGHUP while starting (the state directory is locked already)
    loop.add_signal_handler(signal.SIGHUP, early.append, True)
    supervisor = await app.start(config)
    unix = config.listen.startswith("unix:")  # grpc reports port 1 for a unix socket
    port = supervisor.server.port
    where = config.listen if unix or port == 0 else _with_port(config.listen, supervisor)
    auth = config.auth
    ways = [
        w for w, on in (("tokens", auth.tokens_file), ("client certificates", auth.client_ca)) if on
    ]
    print(
        f"stockade: serving on {where} (engine {config.engine.kind}, "
        f"image {supervisor.sandboxes.image}, state {config.state_dir}, "
        f"auth {' and '.join(ways) or 'off'}{', TLS' if auth.tls_cert else ''})",
        flush=True,
    )
    if supervisor.telemetry.metrics_port:
        host = config.observability.metrics_listen.rpartition(":")[0]
        print(
            f"stockade: metrics on http://{host}:{supervisor.telemetry.metrics_port}/metrics",
            flush=True,
        )
    if supervisor.mcp is not None:
        host = config.mcp.listen.rpartition(":")[0]
        print(f"stockade: MCP on http://{host}:{supervisor.mcp.port}{config.mcp.path}", flush=True)
    if supervisor.e2b is not None:
        host = config.e2b.listen.rpartition(":")[0]
        print(f"stockade: E2B on http://{host}:{supervisor.e2b.port}", flush=True)
    if supervisor.console is not None:
        host = config.console.listen.rpartition(":")[0]
        print(f"stockade: console on http://{host}:{supervisor.console.port}/", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    reloader = Reloader(Reloadable.of(supervisor), config, load)
    loop.add_signal_handler(signal.SIGHUP, reloader.on_signal)
    loop.add_signal_handler(signal.SIGUSR2, waits.log_report)  # what a hang waits on
    if early:
        reloader.on_signal()
    await stop.wait()
    grace = config.housekeeping.shutdown_grace_s
    print(
        f"stockade: shutting down (calls in flight get {grace:g} s); sandboxes keep running "
        "for the next start",
        flush=True,
    )
    await supervisor.stop(grace)


def _reload(ns: argparse.Namespace) -> int:
    """Ask the supervisor serving the state directory to re-read its configuration
    (cli/reloading.py) and print what it did."""
    from pathlib import Path

    from stockade.supervisor.cli.reloading import ask
    from stockade.supervisor.config import load_config
    from stockade.supervisor.errors import StockadeError as ServerError

    try:
        state_dir = Path(ns.state_dir) if ns.state_dir else load_config(ns.config).state_dir
        answer = ask(state_dir, ns.timeout)
    except ServerError as exc:
        print(f"stockade reload: {exc}", file=sys.stderr)
        return 1
    print(f"stockade reload: {printable(str(answer.get('summary', '')))}")
    return 0 if answer.get("ok") else 1


def _with_port(listen: str, supervisor: Any) -> str:
    host = listen.rsplit(":", 1)[0]
    return f"{host}:{supervisor.server.port}"


def _image(ns: argparse.Namespace) -> int:
    from stockade.supervisor.engines.image import (
        ImageBuildError,
        build_image,
        build_supervisor_image,
        default_cache_dir,
    )

    builders = [build_image, build_supervisor_image] if ns.supervisor else [build_image]
    try:
        for build in builders:
            print(build(ns.engine, cache_dir=default_cache_dir(), force=ns.force))
    except ImageBuildError as exc:
        print(f"stockade image build: {exc}", file=sys.stderr)
        return 1
    return 0


def _doctor(ns: argparse.Namespace) -> int:
    from stockade.supervisor.config import load_config

    if ns.sandbox is not None:
        return _doctor_sandbox(ns)
    if ns.json:
        print("stockade doctor: --json goes with --sandbox KEY", file=sys.stderr)
        return EXIT_CLIENT_ERROR
    from stockade.supervisor.cli.doctor import run_checks

    config = load_config(ns.config, {"engine.kind": ns.engine} if ns.engine else None)
    ok = True
    for check in run_checks(config):
        mark = "FAIL" if not check.ok else "WARN" if check.warning else "ok  "
        print(f"[{mark}] {check.name}: {check.detail}")
        if not check.ok or check.warning:
            ok = ok and check.ok
            print(f"       fix: {check.fix}")
    return 0 if ok else 1


def _doctor_sandbox(ns: argparse.Namespace) -> int:
    """Exit 0, or 1 when the sandbox runs privileged or under a runc with a known escape."""
    from stockade.supervisor.cli.doctor import isolation_lines, isolation_ok

    with _client(ns) as client:
        report = client.inspect_isolation(ns.sandbox).to_dict()
    if ns.json:
        print(json.dumps(report, indent=2, ensure_ascii=False))
    else:
        print("\n".join(isolation_lines(report)))
    return 0 if isolation_ok(report) else 1


def _tls(ns: argparse.Namespace) -> TLS | None:
    files = (ns.tls_ca, ns.tls_cert, ns.tls_key)
    try:
        wanted = ns.tls or ns.tls_server_name or any(files)
        return TLS.from_files(*files, server_name=ns.tls_server_name) if wanted else None
    except OSError as exc:
        raise InvalidArgument(f"cannot read a TLS file: {exc}") from None


def _client(ns: argparse.Namespace) -> Stockade:
    return Stockade(ns.server, token=ns.token, tls=_tls(ns))


def _context(ns: argparse.Namespace) -> CallContext:
    return CallContext(agent_id=ns.agent, provider=ns.provider)


def _command_line(ns: argparse.Namespace) -> str:
    """`-- CMD [ARG...]` as one shell command line ("" when none is given)."""
    argv = ns.argv[1:] if ns.argv[:1] == ["--"] else ns.argv
    return "" if not argv else argv[0] if len(argv) == 1 else shlex.join(argv)


def _exec(ns: argparse.Namespace) -> int:
    command = _command_line(ns)
    if not command:
        print("stockade exec: give a command after --", file=sys.stderr)
        return EXIT_CLIENT_ERROR
    args: dict[str, Any] = {"command": command}
    given = (("timeout", ns.timeout), ("workdir", ns.workdir), ("session", ns.session))
    args.update({k: v for k, v in given if v})
    if ns.stdin:
        args["stdin"] = sys.stdin.read()
    with _client(ns) as client:
        if ns.no_stream:
            result = client.call(ns.key, "exec", args, context=_context(ns))
            sys.stdout.write(result.stdout)
            sys.stderr.write(result.stderr)
        else:
            result = terminal.follow(client.call_stream(ns.key, "exec", args, context=_context(ns)))
    sys.stdout.flush()
    if result.exit_code is None or result.error_code == "TIMEOUT":
        print(f"stockade: {result.error_code}: {result.error_message}", file=sys.stderr)
        return EXIT_TIMEOUT if result.error_code == "TIMEOUT" else 1
    return result.exit_code


def _shell(ns: argparse.Namespace) -> int:
    command = _command_line(ns) or "bash"
    return _interactive(ns, command=command, process=None, pty=not ns.no_pty)


def _attach(ns: argparse.Namespace) -> int:
    return _interactive(ns, command=None, process=ns.process, pty=False)


def _interactive(
    ns: argparse.Namespace, *, command: str | None, process: str | None, pty: bool
) -> int:
    with _client(ns) as client:
        code, error = terminal.run(
            client, ns.key, command=command, process=process, pty=pty, context=_context(ns)
        )
    if error:
        print(f"stockade: {error}", file=sys.stderr)
    return code


def _approvals(ns: argparse.Namespace) -> int:
    from stockade.supervisor.cli import approver

    with _client(ns) as client:
        if ns.approvals_command == "resolve":
            client.resolve_approval(ns.id, ns.decision, ns.approver)
            print(f"{ns.id}: {ns.decision}")
        elif ns.approvals_command == "list":
            state = client.list_approvals()
            for p in state.pending:
                shown = (printable(x) for x in (p.sandbox_key, p.agent_id or "-", p.command))
                print(p.id, *shown, sep="  ")
            print(
                f"{len(state.pending)} pending, {state.approvers} approver(s) watching, "
                f"{len(state.always_allowed)} allowed always"
            )
            for command in state.always_allowed:
                print(f"  always: {printable(command)}")
        else:
            return approver.watch(client, ns.approver or _default_approver())
    return 0


def _default_approver() -> str:
    import getpass

    return f"{getpass.getuser()}@cli"


def _audit(ns: argparse.Namespace) -> int:
    if ns.action != "list":
        from stockade.supervisor.cli import audit_chain

        return audit_chain.run(ns)
    with _client(ns) as client:
        records = client.list_audit(
            sandbox_key=ns.key, tool=ns.tool, agent_id=ns.agent, since=_since(ns.since),
            limit=ns.limit, errors_only=ns.errors,
        )  # fmt: skip
    for r in records:
        if ns.json:
            print(json.dumps({**r.__dict__, "time": r.time.isoformat() if r.time else None}))
            continue
        when = r.time.astimezone().strftime("%Y-%m-%d %H:%M:%S") if r.time else "?"
        outcome = r.error_code or "ok"
        via = f"via {r.front}" if r.front not in ("", "grpc") else ""
        extra = " ".join(printable(x) for x in (r.guard_rule, r.approval, via) if x)
        print(  # every text as printable: an alarm's detail cannot repaint the terminal
            f"{when} {printable(r.sandbox_key):<16} {printable(r.agent_id or '-'):<10} "
            f"{printable(r.tool):<10} {printable(outcome):<17} "
            f"{r.duration_ms:>6} ms  {printable(r.policy_step)} {extra}".rstrip()
        )
    return 0


def _policy(ns: argparse.Namespace) -> int:
    from stockade.supervisor.cli import replay

    return replay.run(ns)


def _since(text: str | None) -> datetime | None:
    if not text:
        return None
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        if text[-1:] in units and text[:-1].isdigit():
            return datetime.now(UTC) - timedelta(seconds=int(text[:-1]) * units[text[-1]])
        stamp = datetime.fromisoformat(text)
        return stamp if stamp.tzinfo else stamp.astimezone()
    except (ValueError, OverflowError) as exc:
        raise StockadeError(
            f"--since: use 10m, 2h, 1d or an ISO time from year 1 to 9999, not {text[:80]!r}"
        ) from exc


def _call(ns: argparse.Namespace) -> int:
    with _client(ns) as client:
        result = client.call(ns.key, ns.tool, ns.arguments, context=_context(ns))
    print(json.dumps(result.to_dict(), indent=2, ensure_ascii=False))
    return 1 if result.is_error else 0


def _cp(ns: argparse.Namespace) -> int:
    from stockade.supervisor.cli import copying

    with _client(ns) as client:
        info = copying.copy(client, ns.source, ns.dest, ns.recursive, _context(ns))
    extra = f", {info.files} entries" if info.tar else ""
    scrubbed = f", {info.redactions} credentials redacted" if info.redactions else ""
    print(f"{info.path}: {info.size} bytes{extra}, sha256 {info.sha256}{scrubbed}", file=sys.stderr)
    return 0


def _ls(ns: argparse.Namespace) -> int:
    with _client(ns) as client:
        sandboxes = client.list_sandboxes()
    print(f"{'KEY':<24} {'STATE':<8} {'ENGINE':<7} {'CONTAINER':<14} WORKSPACE")
    for s in sandboxes:
        cid = s.container_id[:12]
        print(f"{printable(s.key):<24} {s.state:<8} {s.engine:<7} {cid:<14} {s.workspace_path}")
        if s.trouble:
            print(f"  broken: {printable(s.trouble)}")
        if s.quarantined_at is not None:
            since = s.quarantined_at.isoformat(timespec="seconds")
            print(f"  quarantined since {since}: `stockade quarantine show {printable(s.key)}`")
        elif s.paused_at is not None:
            print(f"  paused since {s.paused_at.isoformat(timespec='seconds')}")
        if s.heals and s.last_healed_at is not None:
            when = s.last_healed_at.isoformat(timespec="seconds")
            print(f"  healed {s.heals}x, last at {when}: {printable(s.last_heal_reason)}")
    return 0


def _rm(ns: argparse.Namespace) -> int:
    with _client(ns) as client:
        removed = client.destroy_sandbox(ns.key, delete_workspace=ns.delete_workspace)
    print(f"{printable(ns.key)}: {'container removed' if removed else 'no container'}", end="")
    print("; workspace deleted" if ns.delete_workspace else "; workspace kept")
    return 0


def _pause_or_resume(ns: argparse.Namespace) -> int:
    pausing = ns.command == "pause"
    with _client(ns) as client:
        changed = (client.pause_sandbox if pausing else client.resume_sandbox)(ns.key)
    done = {(True, True): "paused", (True, False): "already paused"}
    done |= {(False, True): "resumed", (False, False): "not paused"}
    print(f"{printable(ns.key)}: {done[pausing, changed]}")
    return 0


def _snapshots(ns: argparse.Namespace) -> int:
    from stockade.supervisor.cli import snapshots

    with _client(ns) as client:
        return snapshots.run(client, ns)


def _quarantine(ns: argparse.Namespace) -> int:
    from stockade.supervisor.cli import quarantine

    with _client(ns) as client:
        return quarantine.run(client, ns)


def _mcp(ns: argparse.Namespace) -> int:
    from stockade.client import AsyncStockade
    from stockade.supervisor.cli.mcp_bridge import bridge_key, serve_stdio
    from stockade.supervisor.errors import InvalidRequest
    from stockade.supervisor.keys import validate_key

    key = bridge_key(ns.key)
    try:
        validate_key(key)
    except InvalidRequest as exc:
        raise InvalidArgument(f"--key: {exc}") from None
    tls = _tls(ns)

    async def run() -> None:
        async with AsyncStockade(ns.server, token=ns.token, tls=tls) as client:
            await serve_stdio(client, key, _context(ns))

    asyncio.run(run())
    return 0


def _tools(ns: argparse.Namespace) -> int:
    with _client(ns) as client:
        tools = client.list_tools(ns.format or "json", _context(ns))
    if ns.format:
        print(json.dumps([t.declaration for t in tools], indent=2))
        return 0
    for tool in tools:
        print(f"{tool.name:<12} {tool.group:<8} {tool.description}")
    return 0


_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "serve": _serve,
    "reload": _reload,
    "image": _image,
    "doctor": _doctor,
    "exec": _exec,
    "shell": _shell,
    "attach": _attach,
    "call": _call,
    "cp": _cp,
    "ls": _ls,
    "rm": _rm,
    "pause": _pause_or_resume,
    "resume": _pause_or_resume,
    "snapshot": _snapshots,
    "snapshots": _snapshots,
    "snapshot-rm": _snapshots,
    "restore": _snapshots,
    "fork": _snapshots,
    "undo": _snapshots,
    "quarantine": _quarantine,
    "alarms": _quarantine,
    "tools": _tools,
    "approvals": _approvals,
    "audit": _audit,
    "policy": _policy,
    "mcp": _mcp,
}

if __name__ == "__main__":
    sys.exit(main())
