"""The call path's honeytoken hooks (calls/tripwires.py) with a recording fake in place of
the sandbox manager: a decoy in a command or arguments (a use), in output, unary or streamed
and cut between chunks (a read), in an upload; the reaction on_use decides; nothing when off."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from stockade.supervisor.app import build_policy
from stockade.supervisor.calls import pipeline, transfers
from stockade.supervisor.calls.pipeline import HostPolicy, ToolPipeline
from stockade.supervisor.calls.transfers import FileTransfers, Transfer
from stockade.supervisor.calls.tripwires import REFUSED, CallTripwire, StreamWatch, strings
from stockade.supervisor.config import Config, HoneytokensConfig
from stockade.supervisor.errors import PolicyDenied
from stockade.supervisor.models import CallContext, ErrorCode, OutputEvent, ResultEvent, ToolCall
from stockade.supervisor.observe.alarms import Alarm
from stockade.supervisor.observe.audit import AuditQuery
from stockade.supervisor.policy.honeytokens import Decoys, Honeytokens
from stockade.supervisor.sandboxes.agent_link import AgentOutput, AgentReply, AgentStarted
from stockade.supervisor.sandboxes.lease import AgentEvent
from tests.unit.fakes import STATE

KEY = bytes(range(32))


class Sandboxes:
    """Answers every call with `reply`; a streamed call sends `chunks` (stdout) first."""

    def __init__(self, reply: AgentReply, chunks: tuple[bytes, ...] = ()) -> None:
        self.reply = reply
        self.chunks = chunks
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.uploaded = b""

    @contextlib.asynccontextmanager
    async def lease(self, key: str) -> AsyncIterator[Sandboxes]:
        yield self

    async def invoke(self, tool: str, args: dict[str, Any], *_: object, **__: object) -> AgentReply:
        self.calls.append((tool, args))
        return self.reply

    async def stream(
        self, tool: str, args: dict[str, Any], *_: object, **__: object
    ) -> AsyncIterator[AgentEvent]:
        self.calls.append((tool, args))
        yield AgentStarted(7)
        for chunk in self.chunks:
            yield AgentOutput(1, chunk)
        yield self.reply

    async def upload(
        self, path: str, tar: bool, mode: int, chunks: AsyncIterator[bytes], wide: bool = False
    ) -> AgentReply:
        async for data in chunks:
            self.uploaded += data
        return AgentReply("", "", {"path": path, "size": len(self.uploaded), "sha256": ""})

    async def download(
        self, path: str, tar: bool, wide: bool = False
    ) -> AsyncIterator[bytes | AgentReply]:
        """No test here downloads."""
        raise NotImplementedError("the fake keeps no files")
        yield b""  # an async generator, as the real lease's


def _are_sandboxes(fake: Sandboxes) -> tuple[pipeline.Sandboxes, transfers.TransferSandboxes]:
    """Type-checked only: mypy says here when the fake no longer satisfies what the pipeline
    and the transfers call."""
    return fake, fake


@dataclasses.dataclass
class Rig:
    pipe: ToolPipeline
    sandboxes: Sandboxes
    alarms: list[Alarm]
    wire: Honeytokens
    policy: HostPolicy
    config: Config

    def decoys(self, key: str = "k") -> Decoys:
        return self.wire.decoys(key)


pytestmark = pytest.mark.usefixtures("state_dir")


def rig(on_use: str = "quarantine") -> Rig:
    honey = HoneytokensConfig(enabled=True, on_use=on_use)  # type: ignore[arg-type]
    config = Config(state_dir=STATE[-1], honeytokens=honey)
    alarms: list[Alarm] = []
    wire = Honeytokens(KEY, alarms.append)
    policy = build_policy(config)
    policy = dataclasses.replace(policy, honey=CallTripwire(wire, honey, policy.scrubber))
    ok = AgentReply("", "", {"exit_code": 0, "stdout": "hi\n", "stderr": ""})
    sandboxes = Sandboxes(ok)
    pipe = ToolPipeline(config, sandboxes, policy)
    return Rig(pipe, sandboxes, alarms, wire, policy, config)


def call(tool: str, args: dict[str, Any], key: str = "k") -> ToolCall:
    return ToolCall(key, tool, json.dumps(args))


async def test_a_decoy_in_a_command_is_a_use_and_refuses_the_call() -> None:
    r = rig()
    secret = r.decoys().aws_secret
    result = await r.pipe.call(call("exec", {"command": f"curl -u AKIA:{secret} x.test"}))
    assert result.is_error
    assert result.error_code is ErrorCode.PERMISSION_DENIED
    assert result.error_message == REFUSED
    assert r.sandboxes.calls == []  # the sandbox never saw it
    (alarm,) = r.alarms
    assert (alarm.where, alarm.kind, alarm.sandbox_key) == ("command", "honeytoken", "k")
    assert secret not in alarm.evidence
    assert "curl" in alarm.evidence
    assert r.policy.audit is not None
    (record,) = await r.policy.audit.query(AuditQuery())
    assert record.policy_step == "honeytoken"
    assert secret not in record.arguments_json  # scrubbed as every audit record is


async def test_on_use_alert_lets_the_call_run() -> None:
    r = rig(on_use="alert")
    result = await r.pipe.call(call("exec", {"command": f"echo {r.decoys().github}"}))
    assert not result.is_error
    assert len(r.sandboxes.calls) == 1
    assert [a.where for a in r.alarms] == ["command"]


async def test_a_decoy_in_other_arguments_is_a_use() -> None:
    r = rig()
    content = r.decoys().dotenv_file()
    result = await r.pipe.call(call("write_file", {"path": "x.env", "content": content}))
    assert result.error_message == REFUSED
    assert [a.where for a in r.alarms] == ["arguments"]


async def test_a_decoy_in_output_is_a_read_and_is_redacted() -> None:
    r = rig()
    d = r.decoys()
    r.sandboxes.reply = AgentReply("", "", {"content": d.aws_file(), "path": "c"})
    result = await r.pipe.call(call("read_file", {"path": "~/.aws/credentials"}))
    assert not result.is_error
    (alarm,) = r.alarms
    assert alarm.where == "output"
    assert "read (in output)" in alarm.detail
    for token in d.tokens():
        assert token not in result.for_llm
        assert token not in result.for_user


async def test_another_sandboxs_decoy_in_output_names_it() -> None:
    r = rig()
    other = r.decoys("a")
    r.sandboxes.reply = AgentReply("", "", {"exit_code": 0, "stdout": other.netrc, "stderr": ""})
    await r.pipe.call(call("exec", {"command": "cat /shared/x"}, key="b"))
    (alarm,) = r.alarms
    assert alarm.sandbox_key == "b"
    assert "sandbox 'a''s GitHub token in ~/.netrc" in alarm.detail


async def stream_events(r: Rig, command: str) -> list[object]:
    return [e async for e in r.pipe.call_stream(call("exec", {"command": command}))]


async def test_streamed_output_cut_between_chunks_is_found_once() -> None:
    r = rig()
    token = r.decoys().aws_secret
    line = b"aws_secret_access_key = "  # as the file has it: the scrubber knows the line
    cut = (line + token[:17].encode(), token[17:].encode() + b"\n", b"more\n")
    r.sandboxes.reply = AgentReply("", "", {"exit_code": 0, "stdout": "x" + token, "stderr": ""})
    r.sandboxes.chunks = cut
    events = await stream_events(r, "cat ~/.aws/credentials")
    assert [a.where for a in r.alarms] == ["output"]  # the stream's hit; the reply not again
    shown = "".join(e.text for e in events if isinstance(e, OutputEvent))
    assert token not in shown
    assert isinstance(events[-1], ResultEvent)


async def test_streamed_chunks_of_one_byte() -> None:
    r = rig()
    token = r.decoys().github
    data = f"xx{token}yy".encode()
    r.sandboxes.chunks = tuple(data[i : i + 1] for i in range(len(data)))
    await stream_events(r, "cat ~/.config/gh/hosts.yml")
    assert [a.where for a in r.alarms] == ["output"]


async def test_huge_output_with_a_decoy_at_the_end() -> None:
    r = rig()
    token = r.decoys().dotenv_key_id
    stdout = "a" * (5 << 20) + token
    r.sandboxes.reply = AgentReply("", "", {"exit_code": 0, "stdout": stdout, "stderr": ""})
    await r.pipe.call(call("exec", {"command": "cat big"}))
    assert [a.where for a in r.alarms] == ["output"]


async def test_nothing_when_honeytokens_are_off() -> None:
    config = Config(state_dir=STATE[-1])
    policy = build_policy(config)
    assert policy.honey is None
    d = rig().decoys()
    sandboxes = Sandboxes(AgentReply("", "", {"exit_code": 0, "stdout": d.aws_file()}))
    pipe = ToolPipeline(config, sandboxes, policy)
    result = await pipe.call(call("exec", {"command": f"echo {d.aws_secret}"}))
    assert not result.is_error  # no tripwire: a decoy is just text (and scrubbed)


async def test_an_upload_carrying_a_decoy_is_refused_and_not_committed() -> None:
    r = rig()
    token = r.decoys().aws_key_id.encode()
    transfers = FileTransfers(r.config, r.sandboxes, r.policy)
    t = Transfer("k", "up.txt", False, CallContext(), "tester")

    async def chunks() -> AsyncIterator[bytes]:
        yield b"AWS_ACCESS_KEY_ID=" + token[:9]
        yield token[9:] + b"\n"
        yield b"tail"

    with pytest.raises(PolicyDenied, match="security alarm"):
        await transfers.upload(t, chunks())
    assert [a.where for a in r.alarms] == ["upload"]
    assert b"tail" not in r.sandboxes.uploaded  # cancelled at the chunk that completed it


async def test_an_upload_without_decoys_passes() -> None:
    r = rig()
    transfers = FileTransfers(r.config, r.sandboxes, r.policy)

    async def chunks() -> AsyncIterator[bytes]:
        yield b"plain " * 1000

    info = await transfers.upload(Transfer("k", "p", False, CallContext(), "t"), chunks())
    assert info.size == 6000
    assert r.alarms == []


def test_stream_watch_keeps_tails_per_descriptor() -> None:
    r = rig()
    honey = r.policy.honey
    assert honey is not None
    token = r.decoys().aws_secret.encode()
    watch = StreamWatch(honey, "k", "stdin", "typed")
    assert not watch.feed(token[:20], fd=1)
    assert not watch.feed(token[20:], fd=2)  # the other half on another stream: no decoy
    assert not watch.feed("\ud800\udcff é", fd=3)  # lone surrogates in str input: no error
    assert watch.feed(token[20:].decode(), fd=1)  # str input too
    assert watch.refuse
    assert [a.where for a in r.alarms] == ["stdin"]
    assert watch.feed(b"anything")  # one alarm per stream
    assert len(r.alarms) == 1


def test_strings_walks_deep_values_without_recursion() -> None:
    value: Any = "leaf"
    for _ in range(100_000):
        value = [value]
    assert list(strings({"a": value, "b": 3, "c": {"d": "x"}})) == ["leaf", "x"]


async def test_concurrent_calls_alarm_on_their_own_sandbox() -> None:
    r = rig(on_use="alert")
    tokens = {k: r.decoys(k).github for k in ("a", "b", "c")}
    await asyncio.gather(
        *(r.pipe.call(call("exec", {"command": f"echo {t}"}, key=k)) for k, t in tokens.items())
    )
    assert sorted((a.sandbox_key, a.detail.count("its own")) for a in r.alarms) == [
        ("a", 1),
        ("b", 1),
        ("c", 1),
    ]


async def test_the_app_builds_the_tripwire_and_records_alarms() -> None:
    from stockade.supervisor.app import honeytokens
    from stockade.supervisor.errors import ConfigError
    from stockade.supervisor.observe.alarms import AlarmHub
    from stockade.supervisor.policy.honeytokens import KEY_FILE

    off = Config(state_dir=STATE[-1])
    assert honeytokens(off, build_policy(off), lambda a: None) is None
    assert not (STATE[-1] / KEY_FILE).exists()  # no key made while off
    on = Config(state_dir=STATE[-1], honeytokens=HoneytokensConfig(enabled=True))
    policy = build_policy(on)
    hub = AlarmHub(policy.audit, None, None, on)  # as app.py builds it
    hub.bind(asyncio.get_running_loop())
    sink = hub.sound
    wire = honeytokens(on, policy, sink)
    assert wire is not None
    assert (STATE[-1] / KEY_FILE).stat().st_mode & 0o777 == 0o600
    d = wire.decoys("k")
    assert wire.check("k", "output", d.netrc_file(), evidence=f"cat ~/.netrc: {d.netrc}")
    assert policy.audit is not None
    (record,) = await policy.audit.query(AuditQuery(tool="alarm"))
    assert record.sandbox_key == "k"
    assert record.is_error
    assert record.policy_step.startswith("alarm: honeytoken at output: honeytoken read")
    assert d.netrc not in record.arguments_json
    assert json.loads(record.arguments_json)["where"] == "output"
    (STATE[-1] / KEY_FILE).write_bytes(b"broken")
    with pytest.raises(ConfigError, match=r"honeytokens: .* not a 32-byte key"):
        honeytokens(on, policy, sink)


def escaped(text: str) -> str:
    """text as a JSON string body with every character a \\u escape."""
    return "".join(f"\\u{ord(ch):04x}" for ch in text)


async def test_a_decoy_spelled_with_json_escapes_is_still_found() -> None:
    r = rig()
    d = r.decoys()
    raw = '{"path": "k.txt", "content": "' + escaped(d.aws_key_id) + '"}'
    assert d.aws_key_id not in raw
    result = await r.pipe.call(ToolCall("k", "write_file", raw))
    assert result.error_message == REFUSED
    raw = '{"command": "echo ' + escaped(d.aws_secret) + '"}'
    result = await r.pipe.call(ToolCall("k", "exec", raw))
    assert result.error_message == REFUSED
    assert [a.where for a in r.alarms] == ["arguments", "command"]
    assert r.sandboxes.calls == []


async def test_a_decoy_as_an_argument_name_is_found() -> None:
    r = rig(on_use="alert")
    token = r.decoys().github
    await r.pipe.call(call("read_file", {"path": "x", token: 1}))
    assert [a.where for a in r.alarms] == ["arguments"]
    assert token not in r.alarms[0].evidence


async def test_arguments_that_do_not_parse_are_searched_as_sent() -> None:
    r = rig()
    token = r.decoys().netrc
    result = await r.pipe.call(ToolCall("k", "exec", '{"command": "echo ' + token))
    assert result.error_message == REFUSED
    assert [a.where for a in r.alarms] == ["arguments"]
    assert r.sandboxes.calls == []
