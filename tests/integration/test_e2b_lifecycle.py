"""A sandbox's life through the E2B front as the unmodified e2b SDK sees it, on both engines
(issue 28): paused means paused (`is_running()` False, every envd call refused as E2B's edge
does, `Sandbox.connect` resumes), `lifecycle.auto_resume` resumes on the first envd call,
`lifecycle.on_timeout` "pause" pauses at the timeout instead of killing, a kill while a
command runs ends its stream as E2B's does (the SDK reports the sandbox killed), and `sudo`
is refused with a reason the SDK shows."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from e2b import AsyncSandbox, Sandbox, SandboxState
from e2b.exceptions import SandboxException, SandboxNotRunningException, TimeoutException

from tests.integration.e2b_kit import E2bServed, serving_e2b

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def served(engine: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2bServed]:
    folder = tmp_path_factory.mktemp("e2blife")
    with serving_e2b(engine, folder, e2b="sweep_interval_s = 0.5\n") as served:
        yield served


def audited(served: E2bServed, sandbox_id: str, tool: str) -> list[dict[str, object]]:
    """The arguments of the audit records of `tool` on that sandbox."""
    with served.sup.client(token=served.token) as client:
        records = client.list_audit(limit=500)
    return [
        json.loads(r.arguments_json)
        for r in records
        if r.tool == tool and sandbox_id in r.sandbox_key and r.front == "e2b"
    ]


def test_paused_means_paused_until_connect(served: E2bServed) -> None:
    sbx = Sandbox.create(**served.opts())
    try:
        sbx.files.write("/home/user/kept.txt", "before the pause")
        assert sbx.is_running()
        assert sbx.pause() is True
        assert not sbx.is_running()
        with pytest.raises(SandboxNotRunningException, match="paused"):
            sbx.commands.run("echo never")
        with pytest.raises(SandboxNotRunningException):
            sbx.files.read("/home/user/kept.txt")
        with pytest.raises(SandboxNotRunningException):
            sbx.files.list("/home/user")
        assert sbx.get_info().state == SandboxState.PAUSED  # none of them resumed it
        assert not audited(served, sbx.sandbox_id, "resume_sandbox")
        again = Sandbox.connect(sbx.sandbox_id, **served.opts())
        assert sbx.is_running()
        assert again.is_running()
        assert again.files.read("/home/user/kept.txt") == "before the pause"
        assert again.commands.run("echo back").stdout == "back\n"
    finally:
        sbx.kill()


async def test_paused_means_paused_async(served: E2bServed) -> None:
    sbx = await AsyncSandbox.create(**served.opts())
    try:
        assert await sbx.pause() is True
        assert not await sbx.is_running()
        with pytest.raises(SandboxNotRunningException):
            await sbx.commands.run("echo never")
        await AsyncSandbox.connect(sbx.sandbox_id, **served.opts())
        assert await sbx.is_running()
    finally:
        await sbx.kill()


def test_auto_resume_wakes_a_paused_sandbox(served: E2bServed) -> None:
    sbx = Sandbox.create(lifecycle={"on_timeout": "pause", "auto_resume": True}, **served.opts())
    try:
        assert sbx.get_info().lifecycle == {"on_timeout": "pause", "auto_resume": True}
        assert sbx.pause() is True
        assert sbx.get_info().state == SandboxState.PAUSED
        assert sbx.commands.run("echo awake").stdout == "awake\n"  # resumed it
        assert sbx.get_info().state == SandboxState.RUNNING
        resumed = audited(served, sbx.sandbox_id, "resume_sandbox")
        assert [r["as"] for r in resumed] == ["auto_resume"]
    finally:
        sbx.kill()
    plain = Sandbox.create(**served.opts())
    try:
        assert plain.get_info().lifecycle == {"on_timeout": "kill", "auto_resume": False}
    finally:
        plain.kill()


def test_lifecycle_options_the_sdk_lets_through_are_checked(served: E2bServed) -> None:
    # the SDK refuses auto_resume without on_timeout pause itself; the front too (unit tests)
    sbx = Sandbox.create(
        lifecycle={"on_timeout": {"action": "pause", "mode": "filesystem"}}, **served.opts()
    )
    try:
        assert sbx.get_info().lifecycle == {"on_timeout": "pause", "auto_resume": False}
    finally:
        sbx.kill()


def test_on_timeout_pause_pauses_instead_of_killing(served: E2bServed) -> None:
    sbx = Sandbox.create(timeout=60, lifecycle={"on_timeout": "pause"}, **served.opts())
    try:
        sbx.files.write("/home/user/kept.txt", "kept")
        # the short timeout only once the file is there: a create's `timeout=2` could pass
        # before the write on a loaded machine (seen under make test's parallel shards)
        sbx.set_timeout(2)
        deadline = time.monotonic() + 30
        while sbx.get_info().state != SandboxState.PAUSED:  # the sweep pauses it
            assert time.monotonic() < deadline, "not paused at its timeout"
            time.sleep(0.3)
        assert not sbx.is_running()
        # the record says paused before the freeze; the audit says so once the freeze is done
        while not (paused := audited(served, sbx.sandbox_id, "pause_sandbox")):
            assert time.monotonic() < deadline, "the timeout's pause was never audited"
            time.sleep(0.3)
        assert [p["as"] for p in paused] == ["timeout"]
        assert not audited(served, sbx.sandbox_id, "destroy_sandbox")
        Sandbox.connect(sbx.sandbox_id, timeout=60, **served.opts())
        assert sbx.files.read("/home/user/kept.txt") == "kept"
    finally:
        assert sbx.kill() is True


def test_killing_a_sandbox_drops_its_running_command(served: E2bServed) -> None:
    sbx = Sandbox.create(**served.opts())
    cmd = sbx.commands.run("sleep 60", background=True)
    sbx.kill()
    with pytest.raises(TimeoutException) as dropped:
        cmd.wait()
    assert "sandbox was killed or reached its end of life" in str(dropped.value)


async def test_killing_a_sandbox_drops_its_running_command_async(served: E2bServed) -> None:
    sbx = await AsyncSandbox.create(**served.opts())
    cmd = await sbx.commands.run("sleep 60", background=True)
    await sbx.kill()
    with pytest.raises(TimeoutException) as dropped:
        await cmd.wait()
    assert "sandbox was killed or reached its end of life" in str(dropped.value)


def test_a_pause_drops_the_stream_and_the_process_lives_on(served: E2bServed) -> None:
    sbx = Sandbox.create(**served.opts())
    try:
        cmd = sbx.commands.run("sleep 60", background=True)
        assert sbx.pause() is True
        with pytest.raises(SandboxNotRunningException):  # the SDK probes: 502, paused
            cmd.wait()
        Sandbox.connect(sbx.sandbox_id, **served.opts())
        assert cmd.pid in [p.pid for p in sbx.commands.list()]  # frozen, not ended
        assert sbx.commands.kill(cmd.pid) is True
    finally:
        sbx.kill()


def test_sudo_is_refused_with_its_reason(served: E2bServed) -> None:
    sbx = Sandbox.create(**served.opts())
    try:
        with pytest.raises(SandboxException, match=r"PERMISSION_DENIED.*sudo"):
            sbx.commands.run("sudo id")
        with pytest.raises(SandboxException, match="user 'root' is not available"):
            sbx.commands.run("id", user="root")
    finally:
        sbx.kill()
