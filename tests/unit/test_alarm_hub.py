"""The AlarmHub: every alarm is logged, recorded, counted, handed to watchers and reacted
to as the config says; a slow watcher loses alarms, never blocks sound; a failing reaction
or audit never reaches the caller that sounded."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from stockade.supervisor.config import Config
from stockade.supervisor.config.quarantine import QuarantineConfig
from stockade.supervisor.errors import ConfigError, QuotaExceeded
from stockade.supervisor.observe.alarms import (
    MAX_SUBSCRIBERS,
    SUBSCRIBER_QUEUE,
    Alarm,
    AlarmHub,
    AuditSink,
    from_dict,
    to_dict,
)
from stockade.supervisor.observe.metrics import Metrics


class ListAudit:
    def __init__(self) -> None:
        self.records: list[Any] = []

    def record(self, rec: Any) -> None:
        self.records.append(rec)


def _is_an_audit_sink(audit: ListAudit) -> AuditSink:
    """Type-checked only: mypy says here when the fake no longer satisfies AuditSink."""
    return audit


@dataclass(frozen=True)
class Honey:
    on_read: str = "alert"
    on_use: str = "quarantine"


def hub(
    tmp_path: Path, reacted: list[tuple[str, Alarm]] | None = None, **quarantine: Any
) -> tuple[AlarmHub, ListAudit, Metrics]:
    config = Config(state_dir=tmp_path, quarantine=QuarantineConfig(**quarantine))
    audit, metrics = ListAudit(), Metrics()

    async def react(key: str, alarm: Alarm) -> None:
        if reacted is not None:
            reacted.append((key, alarm))

    return AlarmHub(audit, metrics, react, config), audit, metrics


def alarm(kind: str = "guard", where: str = "guard", key: str = "k") -> Alarm:
    return Alarm(key, kind, where, f"{kind} seen", "evidence")  # type: ignore[arg-type]


async def test_sound_logs_records_counts_and_reacts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    reacted: list[tuple[str, Alarm]] = []
    h, audit, metrics = hub(tmp_path, reacted)
    with caplog.at_level(logging.WARNING, "stockade.alarms"):
        h.sound(alarm())
        await h.settled()
    assert [(key, a.kind) for key, a in reacted] == [("k", "guard")]
    (rec,) = audit.records
    assert rec.tool == "alarm"
    assert rec.policy_step.startswith("alarm: guard at guard: ")
    assert rec.sandbox_key == "k"
    assert rec.is_error
    assert rec.error_code == "ALARM"
    assert json.loads(rec.arguments_json)["detail"] == "guard seen"
    value = metrics.registry.get_sample_value(
        "stockade_alarms_total", {"kind": "guard", "where": "guard"}
    )
    assert value == 1.0
    (line,) = [r for r in caplog.records if r.name == "stockade.alarms"]
    assert line.levelname == "WARNING"
    assert line.__dict__["alarm_kind"] == "guard"  # a LogRecord's `extra` field


async def test_kinds_not_in_on_only_alarm(tmp_path: Path) -> None:
    reacted: list[tuple[str, Alarm]] = []
    h, audit, _ = hub(tmp_path, reacted, on=("honeytoken",))
    h.sound(alarm("guard"))
    h.sound(alarm("placeholder", "egress"))
    await h.settled()
    assert reacted == []
    assert len(audit.records) == 2


async def test_honeytoken_read_alerts_use_quarantines(tmp_path: Path) -> None:
    reacted: list[tuple[str, Alarm]] = []
    h, _, _ = hub(tmp_path, reacted)
    h.sound(alarm("honeytoken", "output"))
    await h.settled()
    assert reacted == []
    h.sound(alarm("honeytoken", "arguments"))
    await h.settled()
    assert [a.where for _, a in reacted] == ["arguments"]


async def test_honeytoken_actions_from_the_honeytokens_section(tmp_path: Path) -> None:
    h, _, _ = hub(tmp_path)
    object.__setattr__(h._config, "honeytokens", Honey(on_read="quarantine", on_use="alert"))
    assert h.quarantines(alarm("honeytoken", "output"))
    assert not h.quarantines(alarm("honeytoken", "egress"))


async def test_a_slow_watcher_loses_the_oldest_and_never_blocks(tmp_path: Path) -> None:
    h, _, _ = hub(tmp_path, on=())
    slow, quick = h.subscribe(), h.subscribe()
    got: list[Alarm] = []

    async def read_quick() -> None:
        async for a in quick:
            got.append(a)

    reader = asyncio.create_task(read_quick())
    total = SUBSCRIBER_QUEUE + 50
    for i in range(total):
        h.sound(alarm(key=f"k{i}"))
        if i % 16 == 0:
            await asyncio.sleep(0)
    lost = slow.lost
    first = await slow.__anext__()
    await h.close()
    await reader
    assert len(got) == total
    assert lost == 50
    assert first.sandbox_key == "k50"


async def test_watchers_are_bounded(tmp_path: Path) -> None:
    h, _, _ = hub(tmp_path)
    subs = [h.subscribe() for _ in range(MAX_SUBSCRIBERS)]
    with pytest.raises(QuotaExceeded):
        h.subscribe()
    subs[0].close()
    h.subscribe()


async def test_a_failing_reaction_or_audit_never_reaches_the_caller(tmp_path: Path) -> None:
    config = Config(state_dir=tmp_path)

    async def react(key: str, alarm: Alarm) -> None:
        raise RuntimeError("boom")

    class Broken:
        def record(self, rec: Any) -> None:
            raise OSError("disk full")

    h = AlarmHub(None, None, react, config)
    h.sound(alarm())
    await h.settled()
    h2 = AlarmHub(Broken(), None, react, config)
    h2.sound(alarm())
    await h2.settled()


async def test_sound_from_another_thread_is_handed_to_the_loop(tmp_path: Path) -> None:
    reacted: list[tuple[str, Alarm]] = []
    h, audit, _ = hub(tmp_path, reacted)
    h.bind(asyncio.get_running_loop())
    thread = threading.Thread(target=h.sound, args=(alarm(),))
    thread.start()
    thread.join()
    for _ in range(100):
        await asyncio.sleep(0.01)
        if reacted:
            break
    await h.settled()
    assert len(reacted) == 1
    assert len(audit.records) == 1


def test_alarms_round_trip_and_hostile_records_are_refused() -> None:
    a = alarm()
    assert from_dict(to_dict(a)) == a
    assert from_dict({"kind": "rm -rf", "sandbox_key": "k"}) is None
    assert from_dict(None) is None
    assert from_dict([1, 2]) is None
    assert from_dict({**to_dict(a), "time": "soon"}) is None
    for bad in (float("nan"), float("inf"), -1, 1e300, None, [1]):
        assert from_dict({**to_dict(a), "time": bad}) is None
    long = from_dict({**to_dict(a), "evidence": "x" * 100_000})
    assert long is not None
    assert len(long.evidence) == 4096


def test_config_checks(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="evidence_window_s"):
        Config(state_dir=tmp_path, quarantine=QuarantineConfig(evidence_window_s=-1))
    with pytest.raises(ConfigError, match="evidence_window_s"):
        Config(state_dir=tmp_path, quarantine=QuarantineConfig(evidence_window_s=1e12))
    with pytest.raises(ConfigError, match="twice"):
        Config(state_dir=tmp_path, quarantine=QuarantineConfig(on=("guard", "guard")))
    from stockade.supervisor.config import load_config

    with pytest.raises(ConfigError, match=r"quarantine\.on"):
        load_config(None, {"state_dir": str(tmp_path), "quarantine.on": ["everything"]})
    with pytest.raises(ConfigError, match="unknown key"):
        load_config(None, {"state_dir": str(tmp_path), "quarantine.off": True})
    ok = load_config(None, {"state_dir": str(tmp_path), "quarantine.on": ["guard"]})
    assert ok.quarantine.on == ("guard",)
