"""`stockade shell`, `attach` and streamed `exec`: this terminal (or pipe) wired to a process in a
sandbox through ToolService.Interact.

With a PTY and a local terminal, the local terminal goes raw (keys, ^C and ^D travel to the
sandbox's terminal as typed) and follows window size changes; with a pipe, end of input
closes the process's stdin. Exits with the process's exit code."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import termios
import threading
import tty
from collections.abc import Iterator

from stockade.client import (
    ApprovalPending,
    CallContext,
    Interaction,
    Output,
    Stockade,
    StockadeError,
    StreamEvent,
    ToolResult,
)

READ_CHUNK = 64 * 1024


def run(
    client: Stockade,
    key: str,
    *,
    command: str | None,
    process: str | None,
    pty: bool,
    context: CallContext,
) -> tuple[int, str]:
    """Run the session; (exit code, error message or "")."""
    local_tty = os.isatty(0) and os.isatty(1)
    cols, rows = _size() if pty and local_tty else (0, 0)
    session = client.interact(
        key, command, process=process, pty=pty, cols=cols, rows=rows, context=context
    )
    with session, _raw(pty and local_tty), _follow_size(session, pty and local_tty):
        threading.Thread(target=_pump, args=(session,), daemon=True).start()
        result = follow(session.events())
    code = (result.data or {}).get("exit_code")
    if isinstance(code, int):
        return code, ""
    return 1, f"{result.error_code}: {result.error_message}"


def _pump(session: Interaction) -> None:
    """Local input to the process until it ends; then close its stdin."""
    try:
        while data := os.read(0, READ_CHUNK):
            session.send(data)
        session.eof()
        session.close_input()
    except (OSError, ValueError):  # the session ended meanwhile
        return


def _size() -> tuple[int, int]:
    size = os.get_terminal_size(1)
    return size.columns, size.lines


def follow(events: Iterator[StreamEvent]) -> ToolResult:
    """Print a streamed call's output as it comes; return its result."""
    for event in events:
        if isinstance(event, Output):
            out = sys.stderr if event.stream == "stderr" else sys.stdout
            out.write(event.text)
            out.flush()
        elif isinstance(event, ApprovalPending):
            print(
                f"stockade: waiting for approval {event.approval_id}: {event.reason}",
                file=sys.stderr,
            )
        elif isinstance(event, ToolResult):
            return event
    raise StockadeError("the stream ended without a result")


@contextlib.contextmanager
def _raw(active: bool) -> Iterator[None]:
    if not active:
        yield
        return
    saved = termios.tcgetattr(0)
    tty.setraw(0)
    try:
        yield
    finally:
        termios.tcsetattr(0, termios.TCSADRAIN, saved)


@contextlib.contextmanager
def _follow_size(session: Interaction, active: bool) -> Iterator[None]:
    if not active:
        yield
        return

    def resized(_signum: int, _frame: object) -> None:
        with contextlib.suppress(ValueError):
            session.resize(*_size())

    previous = signal.signal(signal.SIGWINCH, resized)
    try:
        yield
    finally:
        signal.signal(signal.SIGWINCH, previous)
