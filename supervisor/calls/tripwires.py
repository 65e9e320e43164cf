"""The call path's honeytoken checks (policy/honeytokens.py): where a decoy shows up in a
call, an alarm sounds on the call's sandbox.

    before the call   the command ("command") or else the arguments ("arguments"): a use
    after the call    every output, streamed chunks too ("output"): a read
    Interact          the caller's input ("stdin"): a use; the output as above
    transfers         an upload's bytes ("upload"): a use; a download's ("output"): a read

A use with [honeytokens] on_use = "quarantine" also refuses the call (the alarm's reaction
quarantines the sandbox); a read only sounds (the output is scrubbed as always, and the
decoys are in formats the scrubber knows). Streams are searched with the tripwire's longest
form (a decoy encoded: policy/encodings.py) - 1 bytes of overlap, so a decoy cut between two
chunks is found; one alarm per call at most.

With honeytokens off the pipeline holds no CallTripwire: each hook is one `is None` test."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from stockade.supervisor.config.honey import HoneytokensConfig
from stockade.supervisor.observe.alarms import MAX_EVIDENCE
from stockade.supervisor.policy.honeytokens import Honeytokens
from stockade.supervisor.policy.scrub.scrubber import Scrubber

REFUSED = "call refused: a security alarm was raised on this sandbox; the operator has been told"
"""What a caller whose call used a decoy reads (nothing that says which or why)."""
EVIDENCE_SCRUB_CHARS = 64 * 1024


class CallTripwire:
    def __init__(
        self, tripwire: Honeytokens, config: HoneytokensConfig, scrubber: Scrubber | None
    ) -> None:
        self.tripwire = tripwire
        self.refuse_use = config.on_use == "quarantine"
        self._scrubber = scrubber

    def evidence(self, text: str) -> str:
        """The call as an alarm keeps it: scrubbed, then cut (the tripwire hides decoys)."""
        text = text[:EVIDENCE_SCRUB_CHARS]
        if self._scrubber is not None:
            text, _ = self._scrubber.scrub(text)
        return text[:MAX_EVIDENCE]

    def sound(self, key: str, where: str, data: bytes | str, evidence: str) -> bool:
        """Search data; on a hit (only then: scrubbing costs) make the evidence and sound."""
        if not self.tripwire.find(data):
            return False
        return self.tripwire.check(key, where, data, self.evidence(evidence))

    def before(
        self, key: str, tool: str, arguments_json: str, args: Any, command: str | None
    ) -> bool:
        """Search the call's command, else its arguments: True when the call must be refused
        (a decoy used, and on_use says quarantine). The arguments are searched as parsed
        (names and values), never as the JSON text only: a decoy spelled with JSON escapes
        (a `\\u` escape for any character) is the same decoy."""
        said = f"{tool} {arguments_json}"
        if command is not None and self.sound(key, "command", command, said):
            return self.refuse_use
        text = arguments_json if args is None else "\n".join(strings(args, names=True))
        return self.sound(key, "arguments", text, said) and self.refuse_use

    def output(self, key: str, tool: str, values: Any, evidence: str = "") -> bool:
        """Search every string of a result (its data, its message) for a decoy read."""
        text = "\n".join(strings(values))
        return self.sound(key, "output", text, evidence or tool)

    def stream(self, key: str, where: str, evidence: str) -> StreamWatch:
        return StreamWatch(self, key, where, evidence)


class StreamWatch:
    """One stream (or several, by file descriptor) searched across chunk boundaries."""

    def __init__(self, owner: CallTripwire, key: str, where: str, evidence: str) -> None:
        self._owner = owner
        self._key = key
        self.where = where
        self._evidence = evidence
        self._keep = max(owner.tripwire.longest - 1, 0)
        self._tails: dict[int, bytes] = {}
        self.hit = False

    def feed(self, data: bytes | str, fd: int = 0) -> bool:
        """Search the chunk (with the end of the one before on the same fd); True when the
        stream carries a decoy (once found, not searched again: one alarm)."""
        if self.hit:
            return True
        chunk = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
        joined = self._tails.get(fd, b"") + chunk
        if self._owner.sound(self._key, self.where, joined, self._evidence):
            self.hit = True
            return True
        self._tails[fd] = joined[-self._keep :] if self._keep else b""
        return False

    @property
    def refuse(self) -> bool:
        """A decoy used on this stream, and on_use says quarantine."""
        return self.hit and self.where != "output" and self._owner.refuse_use


def strings(value: Any, *, names: bool = False) -> Iterator[str]:
    """Every string in a JSON-like value (dict values, with `names` their names too, list
    items), depth first, without recursion (a result may nest deep)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            for name, child in reversed(list(item.items())):
                stack.append(child)
                if names:
                    stack.append(str(name))
        elif isinstance(item, (list, tuple)):
            stack.extend(reversed(item))
