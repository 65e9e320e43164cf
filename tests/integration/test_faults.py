"""Faults in the middle of many concurrent calls: the supervisor killed, a container killed, the
engine's service killed and restarted. After recovery every acknowledged write_file is on disk
with its content (the agent syncs before it answers), every sandbox is adopted or recreated, no
call hangs past its deadline and no container is left behind (counted by label)."""

from __future__ import annotations

import contextlib
import itertools
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from stockade.client import Stockade, StockadeError, ToolResult, Unavailable
from stockade.supervisor.cli import launcher
from stockade.supervisor.engines.backends.base import LABEL_KEY
from stockade.supervisor.errors import EngineUnavailable
from stockade.supervisor.sandboxes import workspaces
from tests.integration.harness import (
    NO_RATE_LIMIT,
    PrivateEngine,
    Supervisor,
    engine_cli,
    engine_url,
    instance_containers,
    running_supervisor,
)

pytestmark = pytest.mark.timeout(600)
DEADLINE_S = 60.0
"""Every call's client deadline."""
WAIT_S = 180.0
"""The most a test waits for progress before it fails (a bound, not a speed figure)."""


def content_for(tag: str, i: int) -> str:
    return f"{tag} #{i}\n" + "payload line\n" * (i % 37)


@dataclass(frozen=True)
class Failure:
    what: str
    code: str
    """gRPC status name, or "RESULT" for a tool result with is_error."""
    reason: str
    message: str


@dataclass
class Calls:
    """Worker threads making calls until stopped; what was acknowledged and what failed."""

    target: str
    stop: threading.Event = field(default_factory=threading.Event)
    acked: dict[tuple[str, str], str] = field(default_factory=dict)
    created: list[str] = field(default_factory=list)
    in_flight_keys: set[str] = field(default_factory=set)
    failures: list[Failure] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def spawn(self, work: Callable[[Stockade], None]) -> None:
        def run() -> None:
            with Stockade(self.target) as client:
                work(client)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self.threads.append(thread)

    def call(
        self, client: Stockade, what: str, key: str, tool: str, args: dict[str, object]
    ) -> bool:
        """One call; True if it succeeded, else the failure is recorded."""
        try:
            result = client.call(key, tool, args, deadline=DEADLINE_S)
        except StockadeError as exc:
            self.fail(Failure(what, exc.code, exc.reason, str(exc)))
            return False
        if result.is_error:
            self.fail(Failure(what, "RESULT", result.error_code, result.error_message))
            return False
        return True

    def fail(self, failure: Failure) -> None:
        with self.lock:
            self.failures.append(failure)

    def writer(self, key: str, tag: str, *, keep_going: bool) -> None:
        def work(client: Stockade) -> None:
            for i in itertools.count():
                if self.stop.is_set():
                    return
                path, content = f"{tag}/{i:05}.txt", content_for(tag, i)
                args = {"path": path, "content": content}
                if self.call(client, f"write {key} {path}", key, "write_file", args):
                    with self.lock:
                        self.acked[(key, path)] = content
                elif not keep_going:
                    return
                else:
                    time.sleep(0.1)

        self.spawn(work)

    def execer(self, key: str, *, keep_going: bool) -> None:
        def work(client: Stockade) -> None:
            while not self.stop.is_set():
                args = {"command": "sleep 0.05; echo ok"}
                if not self.call(client, f"exec {key}", key, "exec", args) and not keep_going:
                    return

        self.spawn(work)

    def creator(self, prefix: str, *, keep_going: bool, most: int = 20) -> None:
        """First calls on new keys, one after the other; a key that failed is tried again."""

        def work(client: Stockade) -> None:
            for n in range(most):
                key = f"{prefix}-{n}"
                with self.lock:
                    self.in_flight_keys.add(key)
                while not self.call(client, f"create {key}", key, "exec", {"command": "true"}):
                    if not keep_going or self.stop.is_set():
                        return
                    time.sleep(0.2)
                with self.lock:
                    self.in_flight_keys.discard(key)
                    self.created.append(key)
                if self.stop.wait(0.3):
                    return

        self.spawn(work)

    def acked_count(self, key: str | None = None) -> int:
        with self.lock:
            return sum(1 for k, _ in self.acked if key is None or k == key)

    def failure_count(self) -> int:
        with self.lock:
            return len(self.failures)

    def join(self) -> None:
        """Every worker ends within a deadline: nothing hangs."""
        for thread in self.threads:
            thread.join(DEADLINE_S + 30)
        assert not [t for t in self.threads if t.is_alive()], "a call hung past its deadline"


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"no progress: {what}"
        time.sleep(0.05)


def assert_acked_on_disk(sup: Supervisor, acked: dict[tuple[str, str], str]) -> None:
    """Read on the host, not through the agent: the bytes are in the workspace."""
    assert acked
    for (key, path), content in acked.items():
        on_disk = sup.workspace(key) / path
        assert on_disk.read_text() == content, f"acknowledged write lost: {key} {path}"


def assert_no_leak(engine: str, url: str, sup: Supervisor, keys: set[str]) -> None:
    containers = instance_containers(engine, url, sup)
    assert sorted(c.labels[LABEL_KEY] for c in containers) == sorted(keys)
    assert all(c.running for c in containers)


def running_keys(client: Stockade) -> dict[str, str]:
    return {s.key: s.container_id for s in client.list_sandboxes() if s.state == "RUNNING"}


def test_supervisor_sigkill_during_calls_loses_no_acknowledged_write(engine: str) -> None:
    keys = [f"k{i}" for i in range(4)]
    with running_supervisor(engine, NO_RATE_LIMIT) as sup:
        with sup.client() as c:
            before = {k: c.sandbox(k).ensure().container_id for k in keys}
        calls = Calls(sup.target)
        for n, key in enumerate(keys):
            calls.writer(key, f"w{n}a", keep_going=False)
            calls.writer(key, f"w{n}b", keep_going=False)
            calls.execer(key, keep_going=False)
        calls.creator("new", keep_going=False)
        wait_for(lambda: calls.acked_count() >= 80 and len(calls.created) >= 2, "calls")
        sup.stop(signal.SIGKILL)
        calls.join()

        # Every call cut by the kill failed at once with UNAVAILABLE; none waited out a deadline.
        assert calls.failures
        assert {f.code for f in calls.failures} == {"UNAVAILABLE"}, calls.failures
        assert_acked_on_disk(sup, calls.acked)
        for n in range(len(keys)):  # nothing torn: each writer's files are the acked ones,
            for tag in (f"w{n}a", f"w{n}b"):  # plus perhaps the one in flight, whole
                folder = sup.workspace(keys[n]) / tag
                found = {p.name: p.read_text() for p in folder.iterdir()}
                acked = {
                    p.split("/")[1]: v
                    for (_k, p), v in calls.acked.items()
                    if p.startswith(f"{tag}/")
                }
                extra = set(found) - set(acked)
                assert len(extra) <= 1, extra
                for name in extra:
                    assert found[name] == content_for(tag, int(name.split(".")[0]))
                assert {n: found[n] for n in acked} == acked

        sup.start()
        with sup.client() as c:
            adopted = running_keys(c)
            assert {k: adopted[k] for k in keys} == before, "the same containers, adopted"
            assert set(calls.created) <= set(adopted)
            assert_no_leak(engine, engine_url(engine), sup, set(adopted))
            for (key, path), content in calls.acked.items():
                assert c.sandbox(key).read_file(path) == content
            for key in calls.in_flight_keys:  # its first call was cut: it works now
                assert c.sandbox(key).exec("echo made").stdout == "made\n"
            assert_no_leak(engine, engine_url(engine), sup, set(running_keys(c)))


def test_container_kill_during_calls(engine: str) -> None:
    with running_supervisor(engine, NO_RATE_LIMIT) as sup, sup.client() as c:
        old = c.sandbox("k").ensure().container_id
        other = c.sandbox("other").ensure().container_id
        calls = Calls(sup.target)
        for tag in ("a", "b", "c"):
            calls.writer("k", tag, keep_going=True)
        calls.writer("other", "o", keep_going=True)
        calls.execer("k", keep_going=True)
        long_result: list[object] = []

        def sleep_long() -> None:
            args = {"command": "sleep 100", "timeout": 200}
            try:
                long_result.append(c.call("k", "exec", args, deadline=DEADLINE_S))
            except StockadeError as exc:
                long_result.append(exc)

        long_call = threading.Thread(target=sleep_long)
        long_call.start()
        wait_for(lambda: calls.acked_count("k") >= 30, "writes before the kill")
        assert engine_cli(engine, "kill", old).returncode == 0
        long_call.join(DEADLINE_S + 30)
        assert long_result, "the call in flight hung"
        cut = long_result[0]
        assert isinstance(cut, ToolResult), cut
        assert cut.error_code == "SANDBOX_LOST"
        assert "recreates it" in cut.error_message
        after_kill = calls.acked_count("k")
        wait_for(lambda: calls.acked_count("k") >= after_kill + 30, "writes after recreation")
        calls.stop.set()
        calls.join()

        # The calls cut by the kill say so clearly; nothing else failed.
        assert {(f.code, f.reason) for f in calls.failures} <= {("RESULT", "SANDBOX_LOST")}
        assert not [f for f in calls.failures if "other" in f.what]
        assert_acked_on_disk(sup, calls.acked)
        new = c.sandbox("k").info().container_id
        assert new != old
        assert c.sandbox("other").info().container_id == other
        for (key, path), content in calls.acked.items():
            assert c.sandbox(key).read_file(path) == content
        containers = instance_containers(engine, engine_url(engine), sup)
        assert sorted((x.labels[LABEL_KEY], x.id) for x in containers) == sorted(
            [("k", new), ("other", other)]
        ), "the killed container was removed, nothing else made"


@pytest.fixture
def private_engine(engine: str) -> Iterator[PrivateEngine]:
    own = PrivateEngine(engine, Path(tempfile.mkdtemp(prefix="stke", dir="/tmp")))
    try:
        own.start()
        yield own
    finally:
        own.close()


def test_engine_restart_during_calls(engine: str, private_engine: PrivateEngine) -> None:
    """The engine's service killed and started again (a private one: the shared services stay
    up). Podman's containers outlive its service; dockerd stops its own on the way down, so
    Docker's sandboxes are recreated with their workspaces."""
    name = engine.capitalize()
    state = Path(tempfile.mkdtemp(prefix="stk", dir="/tmp"))
    sup = Supervisor(engine, state, NO_RATE_LIMIT, engine_socket=private_engine.url)
    sup.start()
    keys = ["k0", "k1", "k2"]
    calls = Calls(sup.target)
    try:
        with sup.client() as c:
            before = {k: c.sandbox(k).ensure().container_id for k in keys}
            for n, key in enumerate(keys):
                calls.writer(key, f"w{n}", keep_going=True)
                calls.execer(key, keep_going=True)
            calls.creator("new", keep_going=True)
            wait_for(lambda: calls.acked_count() >= 30 and len(calls.created) >= 1, "calls")
            private_engine.kill()

            with pytest.raises(Unavailable) as down:
                c.sandbox("while-down").exec("true")
            assert down.value.reason == "ENGINE_UNAVAILABLE"
            assert name in str(down.value)
            if engine == "podman":  # running sandboxes are reached directly, not via the engine
                assert c.sandbox("k0").exec("echo still").stdout == "still\n"
            failures_down = calls.failure_count()
            wait_for(
                lambda: calls.failure_count() > failures_down, "calls while the engine is down"
            )

            private_engine.start()
            created = len(calls.created)
            restarted = {k: calls.acked_count(k) for k in keys}
            wait_for(
                lambda: (
                    len(calls.created) > created
                    and all(calls.acked_count(k) >= restarted[k] + 10 for k in keys)
                ),
                "calls after the engine came back",
            )
            calls.stop.set()
            calls.join()

            allowed = {("UNAVAILABLE", "ENGINE_UNAVAILABLE"), ("RESULT", "SANDBOX_LOST")}
            assert {(f.code, f.reason) for f in calls.failures} <= allowed, calls.failures
            if engine == "podman":
                needed_engine = {f.what.split()[0] for f in calls.failures if f.code != "RESULT"}
                assert needed_engine <= {"create"}, "only new sandboxes need the engine"
            assert_acked_on_disk(sup, calls.acked)
            assert c.sandbox("while-down").exec("echo up").stdout == "up\n"
            for key in {*keys, *calls.created}:  # every sandbox works, its files intact
                assert c.sandbox(key).exec("echo ok").stdout == "ok\n"
            after = running_keys(c)
            if engine == "podman":
                assert {k: after[k] for k in keys} == before, "Podman's containers lived on"
        sup.stop()
        sup.start()
        with sup.client() as c:
            assert running_keys(c) == after, "all adopted after a supervisor restart"
            for (key, path), content in calls.acked.items():
                assert c.sandbox(key).read_file(path) == content
        assert_no_leak(engine, private_engine.url, sup, set(after))
    finally:
        calls.stop.set()
        sup.stop()
        with contextlib.suppress(EngineUnavailable):  # the test's own failure says more
            launcher.remove_instance_containers(engine, private_engine.url, state)
        workspaces.unmount_all(state)  # /tmp tmpfs, layered workspaces
        shutil.rmtree(state, ignore_errors=True)
