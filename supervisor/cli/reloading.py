"""`stockade reload` and SIGHUP: the configuration file re-read while `stockade serve` runs.

What reloads, each in one swap (a call or a request already on its way ends with what it
began with):

- `[secrets]`: which secrets there are, their values (re-read from their files or the
  supervisor's environment), hosts, places, tenants and profiles. New containers get them;
  each running sandbox's proxy gets its secrets as configured now, and a secret removed (or
  no longer for that sandbox) is retired there: its placeholder, still in the container's
  environment, is refused wherever it goes (sandboxes/brokering.py rebroker). The scrubber
  learns a new value before any request can carry it.
- The tool policy (`[tools]`, `[agents.A]`, `[groups]`, `[subagents]`: policy/tool_policy.py,
  its rules made anew and swapped whole) and approvals (`[approvals]`, the agents' modes; a
  request already waiting keeps its deadline).
- `auth.tokens_file`'s contents are re-read whenever the file changes, reload or not.

Everything else is kept as `stockade serve` started with it: a reload that finds another
setting changed names it ("not reloaded: restart to apply") and keeps the old value. A file
that does not load changes nothing.

Each reload is an audit record (tool `reload`, caller who asked: `stockade reload` names its
user, a bare signal is `SIGHUP`) naming what changed, never a value; a log line; and
STATE/reload.json, which `stockade reload` waits for (with the id of its request,
STATE/reload-request.json)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import pwd
import re
import signal
import stat
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stockade.supervisor.config import Config, SecretConfig
from stockade.supervisor.errors import ConfigError
from stockade.supervisor.observe.audit import AuditLog, AuditRecord
from stockade.supervisor.policy.approvals import ApprovalManager
from stockade.supervisor.policy.scrub.scrubber import Scrubber
from stockade.supervisor.policy.tool_policy import PolicyEngine
from stockade.supervisor.sandboxes.brokering import SecretChanges
from stockade.supervisor.sandboxes.owner import LOCK_FILE
from stockade.supervisor.text import printable

if TYPE_CHECKING:
    from stockade.supervisor.app import Supervisor

log = logging.getLogger("stockade")

RELOADED = ("secrets", "tools", "agents", "groups", "subagents", "approvals")
"""The top-level settings a reload applies; every other one is kept."""
RESULT = "reload.json"
REQUEST = "reload-request.json"
MAX_BY = 200
"""Characters of a request's `by` kept (it names the user who asked)."""
_HOLDER = re.compile(r"^\d+:\s+FLOCK\s+\S+\s+WRITE\s+(\d+)\s+([0-9a-f]+):([0-9a-f]+):(\d+)\s")


@dataclass(frozen=True)
class Report:
    """What one reload did: the secrets' changes by name, the settings it kept, or why it
    changed nothing."""

    by: str
    request: str = ""
    secrets: SecretChanges = field(default_factory=SecretChanges)
    policy: tuple[str, ...] = ()
    """The tool policy's and approvals' settings that changed (applied)."""
    not_reloaded: tuple[str, ...] = ()
    error: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "by": self.by,
            "request": self.request,
            "ok": not self.error,
            "secrets": dataclasses.asdict(self.secrets),
            "policy": list(self.policy),
            "not_reloaded": list(self.not_reloaded),
            "error": self.error,
        }

    def summary(self) -> str:
        if self.error:
            return f"nothing reloaded: {self.error}"
        parts = [
            f"secrets {what}: {', '.join(names)}"
            for what, names in dataclasses.asdict(self.secrets).items()
            if names
        ] or ["no secret changed"]
        if self.policy:
            parts.append(f"policy changed: {', '.join(self.policy)}")
        if self.not_reloaded:
            parts.append(
                f"not reloaded (restart to apply; the old values stay): "
                f"{', '.join(self.not_reloaded)}"
            )
        return "; ".join(parts)


def changed_settings(old: Config, new: Config) -> list[str]:
    """The settings that differ, as dotted names (a table's keys one level down)."""
    found: list[str] = []
    for top in dataclasses.fields(Config):
        a, b = getattr(old, top.name), getattr(new, top.name)
        if a == b:
            continue
        if dataclasses.is_dataclass(a) and dataclasses.is_dataclass(b):
            found += [
                f"{top.name}.{f.name}"
                for f in dataclasses.fields(a)
                if getattr(a, f.name) != getattr(b, f.name)
            ]
        else:
            found.append(top.name)
    return found


@dataclass(frozen=True)
class Reloadable:
    """What a reload changes in a running supervisor."""

    reload_secrets: Callable[[Mapping[str, SecretConfig]], SecretChanges]
    """The sandbox manager's: new containers and running proxies (sandboxes/manager.py)."""
    scrubber: Scrubber | None
    """Told every value (learn) before any proxy may inject one."""
    audit: AuditLog | None
    tools: PolicyEngine
    approvals: ApprovalManager

    @classmethod
    def of(cls, supervisor: Supervisor) -> Reloadable:
        policy = supervisor.server.policy
        return cls(
            supervisor.sandboxes.reload_secrets,
            policy.scrubber,
            policy.audit,
            policy.tools,
            policy.approvals,
        )


class Reloader:
    """Re-reads the configuration with `load` (the file and flags `stockade serve` was given)
    and applies what may change to the running supervisor's parts; one reload at a time."""

    def __init__(self, parts: Reloadable, config: Config, load: Callable[[], Config]) -> None:
        self._parts = parts
        self._running = config
        """What runs now: the config served with, its reloaded parts replaced."""
        self._load = load
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[Report]] = set()

    def on_signal(self) -> None:
        """SIGHUP: a reload on the event loop (signal handlers must not block)."""
        task = asyncio.get_running_loop().create_task(self.reload())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def reload(self, by: str = "") -> Report:
        async with self._lock:
            request, asked_by = _take_request(self._running.state_dir)
            by = by or asked_by or "SIGHUP"
            try:
                new = await asyncio.to_thread(self._load)
                report = await self._apply(new, by, request)
            except ConfigError as exc:
                report = Report(by, request, error=str(exc))
            self._record(report)
            return report

    async def _apply(self, new: Config, by: str, request: str) -> Report:
        """Everything that can fail first (ConfigError: nothing changed), then the swaps."""
        old, parts = self._running, self._parts
        changed = changed_settings(old, new)
        kept = tuple(name for name in changed if name.split(".")[0] not in RELOADED)
        policy = tuple(name for name in changed if name.split(".")[0] in RELOADED[1:])
        taken = {name: getattr(new, name) for name in RELOADED}
        merged = dataclasses.replace(old, **taken)  # checked whole as at load
        rules = parts.tools.rules_for(merged)  # the names checked against the catalog
        if parts.scrubber is not None:  # before a proxy may put a new value anywhere
            values = [s.value for s in merged.secrets.values()]
            await asyncio.to_thread(parts.scrubber.learn, values)
        parts.tools.reload(rules)
        parts.approvals.reload(merged.approvals, merged.agents)
        changes = parts.reload_secrets(merged.secrets)
        self._running = merged
        return Report(by, request, changes, policy, kept)

    def _record(self, report: Report) -> None:
        summary = report.summary()
        (log.error if report.error else log.info)("reload (%s): %s", report.by, summary)
        audit = self._parts.audit
        if audit is not None:
            audit.record(
                AuditRecord(
                    time=time.time(),
                    request_id=report.request,
                    caller=report.by,
                    sandbox_key="",
                    agent_id="",
                    provider="",
                    tool="reload",
                    arguments_json=json.dumps(report.as_dict()),
                    policy_step=f"reload: {summary}",
                    error_code="INVALID_ARGUMENT" if report.error else "",
                    is_error=bool(report.error),
                )
            )
        result = {**report.as_dict(), "time": time.time(), "summary": summary}
        _write(self._running.state_dir / RESULT, json.dumps(result) + "\n")


def _take_request(state_dir: Path) -> tuple[str, str]:
    """The id and the asker of the `stockade reload` that signalled (removed once read);
    ("", "") for a bare signal."""
    path = state_dir / REQUEST
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            raw = f.read(4096) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    except OSError:
        raw = b""
    with contextlib.suppress(OSError):
        path.unlink()
    try:
        data = json.loads(raw)
    except ValueError:
        return "", ""
    if not isinstance(data, dict):
        return "", ""
    request = printable(str(data.get("request", "")))[:64]
    asker = printable(str(data.get("by", "")))[:MAX_BY]
    return request, asker


def _write(path: Path, text: str) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.unlink(missing_ok=True)
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    partial.rename(path)


def serving_pid(state_dir: Path) -> int | None:
    """The pid of the `stockade serve` that holds the state directory's instance lock (from
    /proc/locks), None when none does."""
    try:
        info = os.stat(state_dir / LOCK_FILE)
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        m = _HOLDER.match(line)
        if (
            m
            and int(m[4]) == info.st_ino
            and os.makedev(int(m[2], 16), int(m[3], 16)) == (info.st_dev)
        ):
            return int(m[1])
    return None


def ask(state_dir: Path, timeout_s: float) -> dict[str, Any]:
    """`stockade reload`: signal the supervisor serving `state_dir` and wait for its answer.
    ConfigError when none serves it or none answers in time."""
    pid = serving_pid(state_dir)
    if pid is None:
        raise ConfigError(f"no `stockade serve` holds the state directory {state_dir}")
    request = uuid.uuid4().hex
    uid = os.getuid()
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    by = f"stockade reload ({user}, uid {uid}, pid {os.getpid()})"
    _write(state_dir / REQUEST, json.dumps({"request": request, "by": by}))
    try:
        os.kill(pid, signal.SIGHUP)
    except OSError as exc:
        raise ConfigError(f"cannot signal the supervisor (pid {pid}): {exc.strerror}") from exc
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            answer = json.loads((state_dir / RESULT).read_text())
        except (OSError, ValueError):
            answer = {}
        if isinstance(answer, dict) and answer.get("request") == request:
            return answer
        time.sleep(0.1)
    raise ConfigError(f"the supervisor (pid {pid}) did not answer within {timeout_s:g} s")
