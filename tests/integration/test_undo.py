"""Checkpoints and `stockade undo` on a real supervisor, both engines: a destructive command
with checkpoints on, the diff the undo shows first, and the workspace put back byte for byte
(contents, modes, links, empty folders); the call's audit record names its checkpoint and the
undo is one record of its own (docs/undo.md)."""

from __future__ import annotations

import asyncio

import pytest

from stockade.client import AsyncStockade, NotFound
from tests.integration.harness import Supervisor, running_supervisor
from tests.integration.snapshot_kit import differences, listing, tenants_supervisor
from tests.integration.test_cli import cli

pytestmark = pytest.mark.timeout(300)

CONFIG = '[checkpoints]\nenabled = true\nbefore = ["commands", "overwrite", "apply_patch"]\n'

SET_UP = (
    "mkdir -p src/deep empty/inner && printf 'one\\ntwo\\nthree\\n' > src/notes.txt && "
    "printf '\\000\\001\\002' > src/deep/blob.bin && printf '#!/bin/sh\\n' > run.sh && "
    "chmod 755 run.sh && chmod 600 src/notes.txt && chmod 1777 empty && "
    "ln -s src/notes.txt link && ln -s /nowhere dangling"
)
DESTROY = (
    "rm -rf src empty && printf 'changed\\n' > run.sh && chmod 700 run.sh && "
    "rm link && ln -s elsewhere link && mkdir -p made/folder && echo new > made/file.txt"
)


def test_undo_restores_the_workspace_byte_for_byte(sup: Supervisor, key: str) -> None:
    with sup.client() as c:
        box = c.sandbox(key)
        assert box.exec(SET_UP).exit_code == 0
        before = listing(sup.workspace(key))
        ran = box.exec(DESTROY)
        assert ran.exit_code == 0, ran.stderr
        assert listing(sup.workspace(key)) != before
        records = c.list_audit(sandbox_key=key, tool="exec")
        [record] = [r for r in records if r.request_id == ran.request_id]
        assert record.checkpoint.startswith("~ckpt-")

    shown = cli(sup, "undo", key)  # no terminal, no --yes: shown, not applied
    assert shown.returncode == 1, shown.stderr
    assert "not applied: run again with --yes" in shown.stderr
    first = shown.stdout.splitlines()[0]
    assert first.startswith(f"checkpoint before call {ran.request_id} (exec, ")
    assert first.endswith("the undo takes back: 3 added, 6 removed, 2 changed"), first
    text = shown.stdout
    for line in (
        "removed src/notes.txt (file 0600)", "-one", "removed empty (folder 1777)",
        "removed empty/inner (folder", "Binary files a/src/deep/blob.bin and b/src/deep/blob.bin",
        "--- a/run.sh", "+++ b/run.sh", "-#!/bin/sh", "+changed",
        "changed run.sh: file 0755 -> file 0700", "link -> src/notes.txt became -> elsewhere",
        "added made (folder", "added made/folder (folder", "+++ b/made/file.txt", "+new",
    ):  # fmt: skip
        assert line in text, (line, text)
    assert listing(sup.workspace(key)) != before  # nothing applied yet

    done = cli(sup, "undo", key, "--to", ran.request_id, "--yes")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == f"{key}: undone to before call {ran.request_id}"
    after = listing(sup.workspace(key))
    assert differences(before, after) == []

    with sup.client() as c:
        assert c.sandbox(key).exec("cat src/notes.txt; readlink link").stdout == (
            "one\ntwo\nthree\nsrc/notes.txt\n"
        )
        steps = [r.policy_step for r in c.list_audit(sandbox_key=key, tool="housekeeping")]
        undone = [s for s in steps if s.startswith("housekeeping: undo: ")]
        assert len(undone) == 1, steps
        assert f"to before call {ran.request_id} (exec)" in undone[0]
        assert "3 added, 6 removed, 2 changed taken back" in undone[0]


def test_undo_steps_back_one_checkpoint_at_a_time(sup: Supervisor, key: str) -> None:
    with sup.client() as c:
        box = c.sandbox(key)
        box.exec("echo 1 > n.txt")  # a new key: no workspace yet, no checkpoint
        box.write_file("n.txt", "2\n")
        box.exec("echo 3 > n.txt")
        with pytest.raises(NotFound, match="no checkpoint before call 'nope'"):
            c.rollback_sandbox(key, "nope", apply=False)
        assert cli(sup, "undo", key, "--yes").returncode == 0
        assert box.read_file("n.txt") == "2\n"  # a read takes no checkpoint; exec would
        assert cli(sup, "undo", key, "--yes").returncode == 0
        assert box.read_file("n.txt") == "1\n"
        assert cli(sup, "undo", key, "--yes").returncode == 2  # none left: the first exec took none


def test_a_key_without_checkpoints_has_nothing_to_undo(sup: Supervisor, key: str) -> None:
    with sup.client() as c, pytest.raises(NotFound, match="has no checkpoint"):
        c.rollback_sandbox(f"{key}-never", apply=False)


def test_another_tenant_can_neither_see_nor_undo_a_checkpoint(engine: str, key: str) -> None:
    with (
        tenants_supervisor(engine, ("alice", "mallory"), CONFIG) as (sup, tokens),
        sup.client(tokens["alice"]) as alice,
        sup.client(tokens["mallory"]) as mallory,
    ):
        box = alice.sandbox(key)
        box.exec("echo mine > secret.txt")
        box.exec("echo changed > secret.txt")
        shown = alice.rollback_sandbox(key, apply=False)
        assert shown.counts == (0, 0, 1)
        with pytest.raises(NotFound, match="has no checkpoint"):
            mallory.rollback_sandbox(key, apply=False)
        with pytest.raises(NotFound, match="has no checkpoint"):
            mallory.rollback_sandbox(key, shown.call_id, apply=True)
        assert box.read_file("secret.txt") == "changed\n"


ROUNDS = 16


def test_calls_and_undos_of_one_key_at_once_all_answer(engine: str, key: str) -> None:
    """Risky calls of one key at once, each with a checkpoint (two kept: each drops one, and
    the drop's collect waits for the store), with undos shown meanwhile (each takes a capture
    while it holds the key's ledger): every one answers. A checkpoint's manifest is written
    after its ledger entry, holding the store until then; a ledger held by a collect or an
    undo waiting for that store was a circle nothing broke (about one run in ten of eight
    rounds hung before the fix, on either engine; none of 120 since)."""
    config = CONFIG + "keep = 2\n[limits]\nrate_per_s = 1000.0\nburst = 1000\n"
    with running_supervisor(engine, extra_config=config) as sup:

        async def rounds() -> None:
            async with AsyncStockade(sup.target, token=sup.token) as ac:
                box = ac.sandbox(key)
                for first in ("echo 0 > n.txt", "echo 1 > n.txt"):  # the second takes one
                    assert (await box.exec(first)).exit_code == 0
                for r in range(ROUNDS):
                    calls = [box.exec(f"echo {r} > f{i}.txt") for i in range(6)]
                    shows = [ac.rollback_sandbox(key, apply=False) for _ in range(2)]
                    done = await asyncio.wait_for(asyncio.gather(*calls, *shows), 60)
                    assert [d.exit_code for d in done[:6]] == [0] * 6, (r, done[:6])
                ran = await box.exec("cat f0.txt f5.txt")
                assert ran.stdout == f"{ROUNDS - 1}\n" * 2

        asyncio.run(rounds())
