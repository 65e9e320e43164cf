"""Alarms: signs of an attack seen anywhere in the supervisor (a honeytoken in a call or a
request, a brokered secret's placeholder on its way to the wrong place, a guard rule marked
`quarantine`), raised once and told everywhere an operator looks: the log, the audit log, a
metric, the stream `WatchAlarms` serves, and the configured reaction (quarantine).

Whoever sees a sign calls `AlarmHub.sound(alarm)` and goes on (sound never blocks and never
raises); the reaction runs on the event loop. Nothing here reads a secret: an alarm carries
names and bounded, scrubbed evidence only."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

AlarmKind = Literal["honeytoken", "placeholder", "guard"]
MAX_EVIDENCE = 4096
"""Characters of evidence an alarm keeps (the triggering call or request, scrubbed)."""


@dataclass(frozen=True)
class Alarm:
    sandbox_key: str
    """The scoped key of the sandbox the sign came from."""
    kind: AlarmKind
    where: str
    """Where the sign was seen: "arguments", "output", "upload", "egress", "guard", ..."""
    detail: str
    """What happened, in words an operator reads (names, never a secret's value)."""
    evidence: str = ""
    """The triggering call or request, scrubbed and cut to MAX_EVIDENCE."""
    time: float = field(default_factory=time.time)


AlarmSink = Callable[[Alarm], None]
"""What sees a sign calls: AlarmHub.sound, or a test's list.append."""


class Tripwire(Protocol):
    """Finds the signs planted for sandboxes (honeytokens) in bytes on their way somewhere.
    The egress proxy and the call pipeline call it; it sounds the alarm itself."""

    longest: int
    """The longest sign in bytes: a caller scanning a stream keeps that many bytes minus one
    from each chunk to find a sign cut in two."""

    def check(self, sandbox_key: str, where: str, data: bytes | str, evidence: str = "") -> bool:
        """True (and the alarm sounded) when data carries a sign."""
        ...


class NoTripwire:
    """No honeytokens planted: nothing to find."""

    longest = 0

    def check(self, sandbox_key: str, where: str, data: bytes | str, evidence: str = "") -> bool:
        return False
