"""Checkpoints (sandboxes/snapshots/checkpoints.py, diffs.py) without an engine: their
bounds over 1,000 calls on a real store, the diff an undo shows, the pipeline's choice of
the calls that get one, and the audit field's place in the hash chain."""

from __future__ import annotations

import json
import os
import secrets
import sys
from pathlib import Path
from typing import Any

import pytest

from stockade.supervisor import database
from stockade.supervisor.app import build_policy
from stockade.supervisor.calls.pipeline import ToolPipeline
from stockade.supervisor.calls.recorder import Trail
from stockade.supervisor.config import Config
from stockade.supervisor.config.service import CheckpointsConfig, TenantConfig
from stockade.supervisor.errors import ConfigError, QuotaExceeded
from stockade.supervisor.models import ErrorCode, ToolCall
from stockade.supervisor.observe.audit import AuditQuery
from stockade.supervisor.sandboxes.snapshots import checkpoints as cp
from stockade.supervisor.sandboxes.snapshots.capture import DIR_FLAGS
from stockade.supervisor.sandboxes.snapshots.diffs import MAX_DIFF_BYTES, diff_trees
from stockade.supervisor.sandboxes.snapshots.repository import MAIN, SnapshotStore
from tests.unit.fakes import STATE
from tests.unit.test_pipeline_and_client import OK, RecordingSandboxes

OWNER = "t-owner"
LINEAGE = "sb-1"


def take(store: SnapshotStore, tree: Path, call_id: str) -> cp.Checkpoint:
    """A checkpoint's capture, as Snapshots._capture makes it (one pass, a transient name)."""
    name = f"~ckpt-{secrets.token_hex(8)}"
    session = store.begin(OWNER)
    try:
        opener = {MAIN: lambda: os.open(tree, DIR_FLAGS)}
        _, stats = session.capture(name, opener, LINEAGE, session.cache(LINEAGE))
    finally:
        session.end()
    return cp.Checkpoint(name, call_id, "exec", 0.0, stats.bytes_read)


def manifests(store: SnapshotStore) -> list[str]:
    return sorted(p.name for p in (store.root / OWNER / "manifests").glob("*.json.gz"))


def point(name: str, size: int) -> cp.Checkpoint:
    return cp.Checkpoint(name, name, "exec", 0.0, size)


def test_bound_drops_the_oldest_by_count_and_by_bytes_and_keeps_the_newest() -> None:
    points = [point(str(n), 10) for n in range(5)]
    assert [p.name for p in cp.bound(points, 3, 0)[0]] == ["2", "3", "4"]
    assert [p.name for p in cp.bound(points, 10, 25)[0]] == ["3", "4"]
    huge = [point("a", 10), point("b", 10**9)]
    kept, dropped = cp.bound(huge, 10, 100)
    assert [p.name for p in kept] == ["b"]
    assert [p.name for p in dropped] == ["a"]


def test_a_thousand_checkpoints_stay_within_keep(store: SnapshotStore, tmp_path: Path) -> None:
    tree = tmp_path / "ws"
    (tree / "dir").mkdir(parents=True)
    (tree / "same.txt").write_text("never changes\n")
    keep = 7
    for n in range(1000):
        (tree / "dir" / "changing.txt").write_text(f"version {n}\n")
        dropped = cp.add(store, OWNER, LINEAGE, take(store, tree, f"call-{n}"), keep, 0)
        assert len(dropped) == (1 if n >= keep else 0)
        assert cp.collect(store, OWNER, LINEAGE) == dropped
        ledger = cp.Ledger(store, OWNER, LINEAGE).load()
        assert len(ledger) == min(n + 1, keep)
        assert len(manifests(store)) == len(ledger)
    assert [p.call_id for p in ledger] == [f"call-{n}" for n in range(1000 - keep, 1000)]
    objects = list((store.root / OWNER / "objects").rglob("*"))
    # the unchanged file once, each kept version of the changing one once: nothing leaks
    assert sum(p.is_file() for p in objects) == keep + 1


def test_a_thousand_checkpoints_stay_within_max_bytes(store: SnapshotStore, tmp_path: Path) -> None:
    tree = tmp_path / "ws"
    tree.mkdir()
    max_bytes = 1 << 20
    for n in range(1000):
        (tree / "big.bin").write_bytes(n.to_bytes(4, "big") * 16384)  # 64 KiB, new each time
        cp.add(store, OWNER, LINEAGE, take(store, tree, f"call-{n}"), 1000, max_bytes)
        cp.collect(store, OWNER, LINEAGE)
        ledger = cp.Ledger(store, OWNER, LINEAGE).load()
        assert sum(p.read_bytes for p in ledger) <= max_bytes
        assert len(manifests(store)) == len(ledger)
    assert len(ledger) == max_bytes // 65536
    assert store.usage(OWNER).bytes < 2 * max_bytes  # the content, and small manifests


def test_a_forged_or_oversized_ledger_is_cut_to_its_bound(store: SnapshotStore) -> None:
    ledger = cp.Ledger(store, OWNER, LINEAGE)
    many = [point(f"n{n}", 1) for n in range(cp.MAX_LEDGER + 500)]
    ledger.save(many, [p.name for p in many])
    points, dropped = ledger.read()
    assert len(points) == len(dropped) == cp.MAX_LEDGER


def test_drops_a_crash_left_undeleted_are_deleted_by_the_next_collect(
    store: SnapshotStore, tmp_path: Path
) -> None:
    tree = tmp_path / "ws"
    tree.mkdir()
    for n in range(3):
        (tree / "f").write_text(str(n))
        cp.add(store, OWNER, LINEAGE, take(store, tree, f"call-{n}"), 1, 0)  # no collect: a crash
    assert len(manifests(store)) == 3
    assert len(cp.collect(store, OWNER, LINEAGE)) == 2
    assert len(manifests(store)) == 1
    assert cp.Ledger(store, OWNER, LINEAGE).read()[1] == []


def write_tree(root: Path) -> None:
    (root / "src").mkdir(parents=True)
    (root / "src" / "main.py").write_text("print('hello')\nprint('bye')\n")
    (root / "gone.txt").write_text("deleted later\n")
    (root / "run.sh").write_text("#!/bin/sh\n")
    os.symlink("src/main.py", root / "link")
    (root / "blob").write_bytes(b"\0\1\2")


def test_the_diff_names_what_changed_and_shows_text(store: SnapshotStore, tmp_path: Path) -> None:
    tree = tmp_path / "ws"
    write_tree(tree)
    before = take(store, tree, "one")
    (tree / "src" / "main.py").write_text("print('hello')\nprint('changed')\n")
    (tree / "gone.txt").unlink()
    (tree / "run.sh").chmod(0o700)
    (tree / "link").unlink()
    os.symlink("elsewhere", tree / "link")
    (tree / "empty-dir").mkdir()
    (tree / "new.txt").write_text("fresh\n")
    (tree / "blob").write_bytes(b"\0\1\3")
    after = take(store, tree, "two")
    diff = diff_trees(
        store.tree(OWNER, before.name),
        store.tree(OWNER, after.name),
        lambda d, n: store.content(OWNER, d, n),
    )
    assert diff.added == ["empty-dir", "new.txt"]
    assert diff.removed == ["gone.txt"]
    assert diff.changed == ["blob", "link", "run.sh", "src/main.py"]
    assert diff.counts == (2, 1, 4)
    text = diff.text
    assert "-print('bye')\n+print('changed')\n" in text
    assert "--- a/src/main.py\n+++ b/src/main.py\n" in text
    assert "+++ b/new.txt" in text
    assert "+fresh" in text
    assert "-deleted later" in text
    assert "removed gone.txt" in text
    assert "Binary files a/blob and b/blob differ" in text
    assert "link -> src/main.py became -> elsewhere" in text
    assert "run.sh: file 0644 -> file 0700" in text
    assert "added empty-dir (folder" in text


def test_a_huge_diff_is_cut_with_a_line_saying_so(store: SnapshotStore, tmp_path: Path) -> None:
    tree = tmp_path / "ws"
    tree.mkdir()
    before = take(store, tree, "one")
    for n in range(40):  # 40 text files of ~200 KiB: ~8 MiB of diff
        (tree / f"f{n:02}.txt").write_text("line of text\n" * 16000)
    after = take(store, tree, "two")
    diff = diff_trees(
        store.tree(OWNER, before.name),
        store.tree(OWNER, after.name),
        lambda d, n: store.content(OWNER, d, n),
    )
    assert diff.counts == (40, 0, 0)
    assert len(diff.text) <= MAX_DIFF_BYTES + 100
    assert diff.text.endswith(f"... the diff is cut at {MAX_DIFF_BYTES} bytes\n")


def test_content_refuses_a_digest_that_is_a_path(store: SnapshotStore) -> None:
    with pytest.raises(Exception, match="not a content digest"):
        store.content(OWNER, "../../../etc/passwd", 10)


# --- the config --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"before": ("everything",)}, "unknown"),
        ({"keep": 0}, "keep must be 1 to 1000"),
        ({"keep": 1001}, "keep must be 1 to 1000"),
        ({"max_mb": -1}, "must not be negative"),
    ],
)
def test_config_refuses_what_it_cannot_bound(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Config(checkpoints=CheckpointsConfig(**fields))


def test_a_tenant_may_turn_them_on_or_off() -> None:
    config = Config(
        checkpoints=CheckpointsConfig(enabled=True),
        tenants={"quiet": TenantConfig(checkpoints=False)},
    )
    assert config.checkpoints_on("loud")
    assert not config.checkpoints_on("quiet")


# --- the pipeline ------------------------------------------------------------------------

pytestmark = pytest.mark.usefixtures("state_dir")


class Taker:
    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[str, str, str]] = []
        self.fail = fail

    async def __call__(self, key: str, call_id: str, tool: str) -> str:
        self.calls.append((key, call_id, tool))
        if self.fail:
            raise QuotaExceeded("the store is full")
        return f"~ckpt-{len(self.calls):04x}"


def with_checkpoints(taker: Taker, **fields: Any) -> tuple[ToolPipeline, RecordingSandboxes, Any]:
    config = Config(
        state_dir=STATE[-1],
        checkpoints=CheckpointsConfig(enabled=True, **fields),
    )
    fake = RecordingSandboxes(OK)
    policy = build_policy(config)
    return ToolPipeline(config, fake, policy, checkpoint=taker), fake, policy


def tool_call(tool: str, args: dict[str, Any]) -> ToolCall:
    return ToolCall("k", tool, json.dumps(args), request_id=f"req-{tool}")


async def test_writes_and_patches_get_a_checkpoint_and_reads_do_not() -> None:
    taker = Taker()
    pipe, fake, policy = with_checkpoints(taker)
    await pipe.call(tool_call("write", {"path": "a.txt", "content": "x"}))
    await pipe.call(tool_call("read", {"path": "a.txt"}))
    await pipe.call(tool_call("exec", {"command": "ls"}))  # not risky by default
    patch = "*** Begin Patch\n*** Add File: b.txt\n+x\n*** End Patch\n"
    await pipe.call(tool_call("apply_patch", {"input": patch}))
    assert taker.calls == [
        ("k", "req-write", "write_file"), ("k", "req-apply_patch", "apply_patch"),
    ]  # fmt: skip
    assert len(fake.calls) == 4
    records = await policy.audit.query(AuditQuery())
    by_tool = {r.tool: r.checkpoint for r in records}
    assert by_tool == {
        "write_file": "~ckpt-0001", "read_file": "", "exec": "", "apply_patch": "~ckpt-0002",
    }  # fmt: skip


async def test_commands_when_asked_for_all_of_them() -> None:
    taker = Taker()
    pipe, _, _ = with_checkpoints(taker, before=("commands", "overwrite"))
    await pipe.call(tool_call("exec", {"command": "ls"}))
    await pipe.call(tool_call("write", {"path": "a.txt", "content": "x"}))
    assert taker.calls == [("k", "req-exec", "exec"), ("k", "req-write", "write_file")]


def test_the_guards_verdict_names_the_risk() -> None:
    pipe, _, _ = with_checkpoints(Taker(), before=("destructive",))
    spec = pipe._policy.catalog.resolve("exec")
    assert spec is not None
    call = tool_call("exec", {"command": "x"})
    assert pipe._risk(call, spec, Trail(guarded=True, risk="destructive")) == "destructive"
    assert pipe._risk(call, spec, Trail(guarded=True, risk="unparsed")) == ""
    assert pipe._risk(call, spec, Trail(guarded=True)) == ""


async def test_no_checkpoint_no_call() -> None:
    """A checkpoint that cannot be taken stops the call before it runs: it could not be
    undone."""
    taker = Taker(fail=True)
    pipe, fake, _ = with_checkpoints(taker)
    result = await pipe.call(tool_call("write", {"path": "a.txt", "content": "x"}))
    assert result.is_error
    assert result.error_code is ErrorCode.EXECUTION_FAILED
    assert "no checkpoint could be taken" in result.error_message
    assert fake.calls == []


async def test_off_for_the_tenant_is_off() -> None:
    taker = Taker()
    pipe, _, _ = with_checkpoints(taker)
    config = Config(state_dir=STATE[-1])
    off = ToolPipeline(config, RecordingSandboxes(OK), build_policy(config), checkpoint=taker)
    await off.call(tool_call("write", {"path": "a.txt", "content": "x"}))
    assert taker.calls == []
    assert pipe is not None


# --- the audit chain ---------------------------------------------------------------------


def test_an_unset_checkpoint_leaves_the_canonical_form_of_the_first_format() -> None:
    base = [1, 1.5, "r", "c", "k", "a", "p", "exec", "{}", "s", "", "", "", 0, 0, 0, 0, "", 0]
    v1 = [*base, "t", "grpc", ""]
    assert len(v1) == database.CHAIN_BASE
    assert database.canonical([*v1, ""]) == database.canonical(v1)
    assert database.canonical([*v1, "~ckpt-1"]) != database.canonical(v1)
    sys.path.insert(0, str(Path(__file__).parents[2] / "scripts"))
    try:
        import verify_audit
    finally:
        sys.path.pop(0)
    for values in ([*v1, ""], [*v1, "~ckpt-1"]):
        assert verify_audit.record_hash(database.GENESIS, values) == database.link_hash(
            database.GENESIS, values
        )


# --- a guard rule with checkpoint = true ---------------------------------------------------


def test_a_checkpoint_rule_does_not_deny_and_names_itself() -> None:
    from stockade.supervisor.policy.guard import Guard
    from stockade.supervisor.policy.guard.model import GuardRule

    guard = Guard(
        [
            GuardRule("migrations", r"^alembic (upgrade|downgrade)", checkpoint=True),
            GuardRule("no-curl", r"^curl "),
        ]
    )
    ran = guard.check("cd db && alembic upgrade head")
    assert (ran.action, ran.checkpoint) == ("allow", "migrations")
    assert guard.check("ls").checkpoint == ""
    denied = guard.check("alembic upgrade head; curl x")
    assert (denied.action, denied.rule) == ("deny", "no-curl")


async def test_a_checkpoint_rule_takes_one_whatever_before_says() -> None:
    from stockade.supervisor.config.policy import GuardConfig, GuardRuleConfig

    taker = Taker()
    rule = GuardRuleConfig("migrations", r"^alembic upgrade", checkpoint=True)
    config = Config(
        state_dir=STATE[-1],
        checkpoints=CheckpointsConfig(enabled=True, before=("apply_patch",)),
        guard=GuardConfig(rules=(rule,)),
    )
    fake = RecordingSandboxes(OK)
    pipe = ToolPipeline(config, fake, build_policy(config), checkpoint=taker)
    await pipe.call(tool_call("exec", {"command": "alembic upgrade head"}))
    await pipe.call(tool_call("exec", {"command": "ls"}))
    assert taker.calls == [("k", "req-exec", "exec")]
    assert len(fake.calls) == 2


def test_a_checkpoint_rule_takes_no_quarantine_action() -> None:
    from stockade.supervisor.config.policy import GuardConfig, GuardRuleConfig

    rule = GuardRuleConfig("m", "x", action="quarantine", checkpoint=True)
    with pytest.raises(ConfigError, match="checkpoint = true does not deny"):
        Config(guard=GuardConfig(rules=(rule,)))
