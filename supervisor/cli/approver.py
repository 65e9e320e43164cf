"""`stockade approvals watch`: an approver in the terminal.

Requests appear as they come (sandbox, agent, tool, command, why, time left; for a file
change, the diff it will make: at most DIFF_LINES lines, each made printable); one key decides
the one shown: o = allow once, a = allow always, d = deny, s = skip (ask again later),
q = quit. On a terminal a single key press is enough; otherwise one letter per line."""

from __future__ import annotations

import contextlib
import os
import queue
import select
import sys
import termios
import threading
import tty
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

from stockade.client import ApprovalClosed, ApprovalRequest, Stockade, StockadeError
from stockade.supervisor.text import printable

DIFF_LINES = 200
"""Lines of a file change's diff shown (the supervisor cuts it at 64 KiB already)."""
KEYS = {"o": "allow-once", "a": "allow-always", "d": "deny"}
HELP = "o = allow once, a = allow always, d = deny, s = skip, q = quit"
Event = ApprovalRequest | ApprovalClosed | StockadeError


def watch(client: Stockade, approver: str) -> int:
    events: queue.Queue[Event] = queue.Queue()
    threading.Thread(target=_pump, args=(client, approver, events), daemon=True).start()
    print(f"stockade: watching for approval requests as {approver} ({HELP})", flush=True)
    pending: dict[str, ApprovalRequest] = {}
    shown: str | None = None
    with _key_reader() as read_key:
        while True:
            error = _drain(events, pending)
            if error is not None:
                print(f"stockade: {error}", file=sys.stderr)
                return 2
            if shown not in pending:
                shown = _show_next(pending)
            key = read_key(0.2)
            if key in ("q", ""):
                return 0
            if key is None or shown is None:
                continue
            if key == "s":
                pending[shown] = pending.pop(shown)
                shown = None
            elif key in KEYS:
                _decide(client, shown, KEYS[key], approver)
                pending.pop(shown, None)
                shown = None


def _pump(client: Stockade, approver: str, events: queue.Queue[Event]) -> None:
    try:
        for event in client.watch_approvals(approver):
            events.put(event)
    except StockadeError as exc:
        events.put(exc)


def _drain(events: queue.Queue[Event], pending: dict[str, ApprovalRequest]) -> Event | None:
    while True:
        try:
            event = events.get_nowait()
        except queue.Empty:
            return None
        if isinstance(event, StockadeError):
            return event
        if isinstance(event, ApprovalRequest):
            pending[event.id] = event
        elif pending.pop(event.id, None) is not None:
            print(f"  [{event.id}] closed: {event.outcome} {event.approver}".rstrip(), flush=True)


def _show_next(pending: dict[str, ApprovalRequest]) -> str | None:
    if not pending:
        return None
    request = next(iter(pending.values()))
    left = ""
    if request.expires_at is not None:
        seconds = (request.expires_at - datetime.now(UTC)).total_seconds()
        left = f", {max(seconds, 0):.0f} s left"
    print(
        f"\n[{request.id}] sandbox {request.sandbox_key!r}, "
        f"agent {printable(request.agent_id or '-')}, tool {request.tool}{left}\n"
        f"  $ {printable(request.command)}\n  ({printable(request.reason)})\n"
        f"{_diff_lines(request.diff)}"
        f"  decide: {HELP}",
        flush=True,
    )
    return request.id


def _diff_lines(diff: str) -> str:
    """The diff indented under the request, one terminal line per line, cut at DIFF_LINES
    with a line saying how many more there are."""
    if not diff:
        return ""
    lines = diff.splitlines()
    shown = "".join(f"  | {printable(line)}\n" for line in lines[:DIFF_LINES])
    if len(lines) > DIFF_LINES:
        shown += f"  | ... {len(lines) - DIFF_LINES} more lines of the diff not shown\n"
    return shown


def _decide(client: Stockade, request_id: str, decision: str, approver: str) -> None:
    try:
        client.resolve_approval(request_id, decision, approver)
    except StockadeError as exc:
        print(f"  [{request_id}] could not {decision}: {exc}", flush=True)
        return
    print(f"  [{request_id}] {decision}", flush=True)


@contextlib.contextmanager
def _key_reader() -> Iterator[Callable[[float], str | None]]:
    """read(timeout) -> a key, "" at end of input, or None when nothing came in time."""
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd) if os.isatty(fd) else None
    if saved is not None:
        tty.setcbreak(fd)

    def read(timeout: float) -> str | None:
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            return None
        data = os.read(fd, 1 if saved is not None else 4096)
        if not data:
            return ""
        return data.decode(errors="replace").strip()[:1].lower() or None

    try:
        yield read
    finally:
        if saved is not None:
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)
