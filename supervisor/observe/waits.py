"""What every suspended coroutine of the supervisor waits on, for a hang (SIGUSR2).

`kill -USR2 <pid>` of a running `stockade serve` logs one WARNING record: each chain of
awaits still suspended, outermost first, as file:line function, and the object at its end
(a future, a lock's waiter). A call that never answers shows where it waits and what holds
it (a lock's other holder is another chain in the same record). grpc.aio runs handlers from
compiled coroutines, which hide their awaits; so the chains are found from the interpreter's
objects, each coroutine or async generator that no other one awaits being a chain's start.
Nothing is changed, and nothing the chains hold is shown but their code's places.
"""

from __future__ import annotations

import gc
import logging
import types
from collections.abc import Iterator
from typing import Any

log = logging.getLogger("stockade.waits")
MAX_DEPTH = 80
MAX_CHAINS = 500

_Suspended = (types.CoroutineType, types.AsyncGeneratorType)


def chains() -> list[list[str]]:
    """Each chain of suspended awaits, outermost first (at most MAX_CHAINS of MAX_DEPTH)."""
    found = [o for o in gc.get_objects() if isinstance(o, _Suspended) and _frame(o) is not None]
    awaited = {id(a) for o in found if (a := _awaiting(o)) is not None}
    out = []
    for start in found:
        if id(start) in awaited:
            continue
        out.append(list(_chain(start)))
        if len(out) >= MAX_CHAINS:
            break
    return out


def report() -> str:
    listed = chains()
    lines = [f"{len(listed)} chain(s) of suspended awaits:"]
    for chain in listed:
        lines.append("- " + "\n    ".join(chain))
    return "\n".join(lines)


def log_report() -> None:
    """The signal's handler: never raises (a report that fails says why)."""
    try:
        text = report()
    except Exception as exc:  # a diagnostic must not end the supervisor
        text = f"no report of suspended awaits: {exc!r}"
    log.warning("%s", text)


def _chain(start: Any) -> Iterator[str]:
    current, depth = start, 0
    while current is not None and depth < MAX_DEPTH:
        depth += 1
        frame = _frame(current)
        if frame is None:
            yield f"<{type(current).__name__}>"
            return
        code = frame.f_code
        yield f"{code.co_filename}:{frame.f_lineno} {code.co_name}"
        current = _awaiting(current)


def _frame(o: Any) -> types.FrameType | None:
    for name in ("cr_frame", "ag_frame", "gi_frame"):
        frame = getattr(o, name, None)
        if isinstance(frame, types.FrameType):
            return frame
    return None


def _awaiting(o: Any) -> Any:
    for name in ("cr_await", "ag_await", "gi_yieldfrom"):
        inner = getattr(o, name, None)
        if inner is not None:
            return inner
    return None
