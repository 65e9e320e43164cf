"""The `stockade` command line: its commands, their options and arguments."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

DESCRIPTION = """The `stockade` command: the server side (serve, image build, doctor) and client
commands that use only the public client API (exec, call, ls, rm, snapshot, tools, ...)."""


def command_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stockade", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the supervisor in the foreground")
    serve.add_argument("--config", type=Path, help="TOML config file")
    serve.add_argument("--listen", help="host:port or unix:/path (default 127.0.0.1:50051)")
    serve.add_argument("--engine", choices=["podman", "docker", "kubernetes"])
    serve.add_argument("--state-dir", help="default /var/lib/stockade")
    serve.add_argument(
        "--no-auth",
        action="store_true",
        help="serve without authentication (auth.enabled = false; unix socket or loopback only)",
    )

    reload = sub.add_parser(
        "reload",
        help="make the running supervisor re-read its configuration (as SIGHUP does)",
        description="Re-read [secrets], the tool policy and approvals (and name the other "
        "changed settings, which need a restart); "
        "the running `stockade serve` of the state directory does it and answers.",
    )
    reload.add_argument("--config", type=Path, help="TOML config file (for its state_dir)")
    reload.add_argument("--state-dir", help="the supervisor's state directory")
    reload.add_argument("--timeout", type=float, default=60.0, help="seconds to wait")

    image = sub.add_parser("image", help="sandbox image")
    image_sub = image.add_subparsers(dest="image_command", required=True)
    build = image_sub.add_parser("build", help="build the sandbox image for an engine")
    build.add_argument("--engine", choices=["podman", "docker"], default="podman")
    build.add_argument("--force", action="store_true", help="rebuild even if up to date")
    build.add_argument(
        "--supervisor", action="store_true",
        help="also build the supervisor's own image (the top-level Containerfile)",
    )  # fmt: skip

    doctor = sub.add_parser(
        "doctor", help="check engine, runtime, cgroups and image; or one sandbox's isolation"
    )
    doctor.add_argument("--config", type=Path)
    doctor.add_argument("--engine", choices=["podman", "docker", "kubernetes"])
    doctor.add_argument("--sandbox", metavar="KEY", help="report this sandbox's isolation")
    doctor.add_argument("--json", action="store_true", help="with --sandbox: the report as JSON")
    doctor.add_argument("--server", help="with --sandbox: supervisor address")
    _credential_flags(doctor)

    client = argparse.ArgumentParser(add_help=False)
    client.add_argument("--server", help="supervisor address (default $STOCKADE_ADDR)")
    _credential_flags(client)
    client.add_argument("--agent", default="", help="agent id for policy (CallContext)")
    client.add_argument("--provider", default="", help="model provider for policy")
    run = sub.add_parser("exec", parents=[client], help="run a command in a sandbox")
    run.add_argument("--timeout", type=float, help="seconds")
    run.add_argument("--workdir")
    run.add_argument(
        "--session", help="a shell session: cd, export, source and set -o carry to its next call"
    )
    run.add_argument("--stdin", action="store_true", help="send this command's stdin to CMD")
    run.add_argument("--no-stream", action="store_true", help="print the output at the end")
    run.add_argument("key")
    run.add_argument("argv", nargs=argparse.REMAINDER, help="-- COMMAND [ARG...]")
    shell = sub.add_parser(
        "shell", parents=[client], help="an interactive command in a sandbox (default: bash)"
    )
    shell.add_argument("--no-pty", action="store_true", help="pipes instead of a terminal")
    shell.add_argument("key")
    shell.add_argument("argv", nargs=argparse.REMAINDER, help="-- COMMAND [ARG...]")
    attach = sub.add_parser(
        "attach", parents=[client], help="attach to a background process (process tool)"
    )
    attach.add_argument("key")
    attach.add_argument("process", help="its id (p1, ...) or name")
    call = sub.add_parser("call", parents=[client], help="call a tool; print the ToolResult")
    call.add_argument("key")
    call.add_argument("tool")
    call.add_argument("arguments", nargs="?", default="", help="JSON object")
    cp = sub.add_parser("cp", parents=[client], help="copy files: LOCAL KEY:PATH or KEY:PATH LOCAL")
    cp.add_argument("-r", "--recursive", action="store_true", help="copy a directory (as tar)")
    cp.add_argument("source")
    cp.add_argument("dest")
    sub.add_parser("ls", parents=[client], help="list sandboxes")
    rm = sub.add_parser("rm", parents=[client], help="destroy a sandbox's container")
    rm.add_argument("--delete-workspace", action="store_true")
    rm.add_argument("key")
    for verb, what in (("pause", "freeze"), ("resume", "thaw")):
        toggle = sub.add_parser(verb, parents=[client], help=f"{what} a sandbox's processes")
        toggle.add_argument("key")
    _snapshot_commands(sub, client)
    from stockade.supervisor.cli.quarantine import add_commands

    add_commands(sub, client)
    tools = sub.add_parser("tools", parents=[client], help="list the tools policy allows")
    tools.add_argument(
        "--format", choices=["json", "openai", "anthropic", "gemini"],
        help="print the declarations in this provider format (a JSON array)",
    )  # fmt: skip
    approvals = sub.add_parser("approvals", help="approve or deny commands")
    approvals_sub = approvals.add_subparsers(dest="approvals_command", required=True)
    watch = approvals_sub.add_parser("watch", parents=[client], help="interactive approver")
    watch.add_argument("--approver", default="", help="your name in the audit log")
    resolve = approvals_sub.add_parser("resolve", parents=[client], help="decide one request")
    resolve.add_argument("id")
    resolve.add_argument("decision", choices=["allow-once", "allow-always", "deny"])
    resolve.add_argument("--approver", default="")
    approvals_sub.add_parser("list", parents=[client], help="pending requests and allow-always")
    mcp = sub.add_parser(
        "mcp", parents=[client], help="an MCP server on stdin/stdout, forwarding to the supervisor"
    )
    mcp.add_argument("--key", default="", help="the sandbox key (default: one of its own)")
    audit = sub.add_parser("audit", parents=[client], help="the audit log, newest first")
    audit.add_argument("--key", default="")
    audit.add_argument("--tool", default="")
    audit.add_argument("--since", help="e.g. 10m, 2h, 1d or an ISO time")
    audit.add_argument("--limit", type=int, default=50)
    audit.add_argument("--errors", action="store_true", help="only failed calls")
    audit.add_argument("--json", action="store_true", help="one JSON object per line")
    from stockade.supervisor.cli.audit_chain import add_options
    from stockade.supervisor.cli.replay import add_commands as add_policy

    add_options(audit)
    add_policy(sub)
    return parser


def _snapshot_commands(
    sub: argparse._SubParsersAction[Any], client: argparse.ArgumentParser
) -> None:
    """snapshot, snapshots, snapshot-rm, restore, fork (docs/sandboxes.md#snapshots) and undo
    (docs/undo.md)."""
    tmp_help = "capture the sandbox's /tmp as well (needs its container)"
    snapshot = sub.add_parser("snapshot", parents=[client], help="snapshot a sandbox's files")
    snapshot.add_argument("--tmp", action="store_true", help=tmp_help)
    snapshot.add_argument("key")
    snapshot.add_argument("name", nargs="?", default="", help="default: snap-TIME")
    snapshots = sub.add_parser(
        "snapshots", parents=[client], help="list the snapshots and the quota they use"
    )
    snapshots.add_argument("--key", default="", help="only those taken of this sandbox")
    snapshots.add_argument("--json", action="store_true", help="the list as one JSON object")
    remove = sub.add_parser("snapshot-rm", parents=[client], help="delete a snapshot")
    remove.add_argument("name")
    restore = sub.add_parser(
        "restore", parents=[client], help="replace a sandbox's files with a snapshot's"
    )
    restore.add_argument("key")
    restore.add_argument("snapshot")
    undo = sub.add_parser(
        "undo", parents=[client],
        help="put a sandbox's files back as they were before a call (docs/undo.md)",
    )  # fmt: skip
    undo.add_argument("key")
    undo.add_argument("--to", default="", metavar="CALL_ID", help="default: the newest checkpoint")
    undo.add_argument("--yes", action="store_true", help="apply without asking")
    fork = sub.add_parser(
        "fork", parents=[client], help="new sandboxes with a sandbox's files as they are now"
    )
    fork.add_argument("--tmp", action="store_true", help=tmp_help)
    fork.add_argument("source")
    fork.add_argument("new_keys", nargs="+", metavar="new_key")


def _credential_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--token", help="bearer token (default $STOCKADE_TOKEN)")
    parser.add_argument("--tls", action="store_true", help="connect with TLS (system CAs)")
    parser.add_argument("--tls-ca", help="PEM file of the CA of the server's certificate")
    parser.add_argument("--tls-cert", help="PEM file: this client's certificate (mutual TLS)")
    parser.add_argument("--tls-key", help="PEM file: the key of --tls-cert")
    parser.add_argument(
        "--tls-server-name", default="", help="the name the server's certificate must carry"
    )


def parse(argv: list[str]) -> argparse.Namespace:
    """The command line. `exec` and `shell` take everything after KEY as the command, so
    their own options written after KEY (`stockade shell demo --no-pty`, `stockade exec demo
    --timeout 5 -- ls`) are moved before it: the options up to `--`, or all that follow KEY
    when each is an option and no `--` comes."""
    command_line = command_parser()
    ns = command_line.parse_args(argv)
    if ns.command not in ("exec", "shell") or not ns.argv or not ns.argv[0].startswith("-"):
        return ns
    rest = list(ns.argv)
    before = argv[: len(argv) - len(rest)]  # ... exec|shell [OPTIONS] KEY [--]
    if before[-1:] == ["--"]:  # argparse drops the `--` right after KEY: all is the command
        return ns
    if "--" in rest:
        cut = rest.index("--")
        options, command = rest[:cut], rest[cut + 1 :]
    elif all(word.startswith("-") for word in rest):
        options, command = rest, []
    else:
        return ns
    if not options:
        return ns
    return command_line.parse_args([*before[:-1], *options, before[-1], "--", *command])
