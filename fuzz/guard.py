"""The guard's shell parser and checks (policy/guard/parsing/, `Guard.check`): any command
string, lone surrogates included (a JSON string may carry them), must come back as a
decision. Nothing is a clean refusal: `check` never raises."""

from __future__ import annotations

from stockade.supervisor.policy.guard import Guard

INSTRUMENT = ("stockade",)
REFUSALS: tuple[type[BaseException], ...] = ()
GUARD = Guard()
WORKDIRS = (".", None, "sub/dir", "/tmp")


def one(data: bytes) -> None:
    workdir = WORKDIRS[data[0] % len(WORKDIRS)] if data else "."
    command = data[1:].decode("utf-8", "surrogateescape")
    result = GUARD.check(command, workdir=workdir)
    if result.action not in ("allow", "deny", "ask"):
        raise AssertionError(f"no decision: {result!r}")
