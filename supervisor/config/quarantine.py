"""[quarantine]: which alarms freeze a sandbox, and how much of the audit log `stockade
quarantine show` gives as evidence. (observe/alarms.py sounds the alarms; sandboxes/
quarantine.py does the freezing.)"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

AlarmKindName = Literal["honeytoken", "placeholder", "guard"]
"""The kinds of alarm (observe/alarms.py AlarmKind, repeated here: config imports nothing
of the layers it configures)."""
MAX_EVIDENCE_WINDOW_S = 86400.0


@dataclass(frozen=True)
class QuarantineConfig:
    on: tuple[AlarmKindName, ...] = ("honeytoken", "placeholder", "guard")
    """The kinds of alarm that quarantine the sandbox they came from; the others only alarm
    (log line, audit record, metric, WatchAlarms). A honeytoken seen in output (a read) obeys
    [honeytokens] on_read instead, one used elsewhere [honeytokens] on_use, when that
    section exists."""
    evidence_window_s: float = 300.0
    """`show` gives the sandbox's audit records from this long before its first alarm to
    this long after its last."""


def check_quarantine(q: QuarantineConfig) -> None:
    """ConfigError for a window out of range or a kind named twice."""
    from stockade.supervisor.errors import ConfigError

    if not 0 <= q.evidence_window_s <= MAX_EVIDENCE_WINDOW_S:
        raise ConfigError(
            f"quarantine.evidence_window_s must be between 0 and {MAX_EVIDENCE_WINDOW_S:.0f} s, "
            f"got {q.evidence_window_s}"
        )
    if len(set(q.on)) != len(q.on):
        raise ConfigError(f"quarantine.on names a kind twice: {list(q.on)}")
