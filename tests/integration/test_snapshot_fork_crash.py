"""A supervisor killed in the middle of a fork (SIGKILL once the fork's transient capture is
written, while its new sandboxes are being made), or of an undo's diff (once its capture of
now is written, while it is compared with the checkpoint), on both engines: the capture is
left in the tenant's store, counted in its bytes; after the restart the tenant's next
snapshot operation removes it and the content only it used (SnapshotStore.hold_transient:
the lock on it died with its process), and a checkpoint stays. The control is the store as
the kill left it."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable

import pytest

from tests.integration.harness import Supervisor, running_supervisor
from tests.integration.snapshot_kit import Snaps

pytestmark = pytest.mark.timeout(300)

MANY = r"""set -e
mkdir -p many && cd many
for d in $(seq 1 20); do mkdir d$d; for f in $(seq 1 100); do echo "$d $f" > d$d/f$f; done; done
"""
FORKS = 10


def transient(sup: Supervisor, prefix: str = "~") -> list[str]:
    """The store's files of transient captures (their manifests and lock files)."""
    found = (sup.state_dir / "snapshots").glob(f"*/manifests/{prefix}*")
    return sorted(p.name for p in found)


def killed_once_written(sup: Supervisor, prefix: str, call: Callable[[], object]) -> None:
    """Run `call` in a thread, SIGKILL the supervisor once a capture named `prefix`... is
    written, and check that the call failed with it."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # the supervisor dies under it
            failed.append(exc)

    running = threading.Thread(target=run)
    running.start()
    deadline = time.monotonic() + 120
    while not any(n.endswith(".json.gz") for n in transient(sup, prefix)):
        assert time.monotonic() < deadline, f"no {prefix} capture was ever written"
        assert running.is_alive(), f"the call ended before it could be cut: {failed}"
        time.sleep(0.001)
    sup.stop(signal.SIGKILL)
    running.join(60)
    assert failed, "the call did not fail with its supervisor"


def test_a_fork_cut_by_the_supervisor_s_death_is_removed_after_the_restart(
    engine: str,
) -> None:
    with running_supervisor(engine) as sup:
        with sup.client() as c:
            assert c.sandbox("src").exec(MANY).exit_code == 0

        def fork() -> None:
            with Snaps(sup.target) as snaps:
                snaps.fork("src", [f"f{i}" for i in range(FORKS)])

        killed_once_written(sup, "~fork-", fork)
        left = transient(sup)
        assert [n for n in left if n.endswith(".json.gz")], f"the control: {left}"
        sup.start()
        with Snaps(sup.target) as snaps:
            assert snaps.list_snapshots().bytes > 0, "the dead fork's capture counts until then"
            snaps.snapshot("src", "after")  # the owner's next operation on its store
            assert transient(sup) == []
            snaps.delete("after")
            usage = snaps.list_snapshots()
            assert (list(usage.snapshots), usage.bytes) == ([], 0), "nothing of it is left"


CHECKPOINTS = '[checkpoints]\nenabled = true\nbefore = ["commands"]\n'
CHANGE_ALL = "for f in many/d*/f*; do echo changed >> $f; done"


def test_an_undo_s_diff_cut_by_the_supervisor_s_death_is_removed_after_the_restart(
    engine: str,
) -> None:
    """The diff an undo shows first compares a capture of now with the checkpoint: every one
    of the 2,000 files changed, so the comparison (a text diff each) outlasts the poll."""
    with running_supervisor(engine, CHECKPOINTS) as sup:
        with sup.client() as c:
            assert c.sandbox("src").exec(MANY).exit_code == 0
            assert c.sandbox("src").exec(CHANGE_ALL).exit_code == 0
            deadline = time.monotonic() + 30  # its manifest is written beside the call (a
            # .json.tmp renamed once whole)
            while not (points := [n for n in transient(sup, "~ckpt-") if n.endswith(".gz")]):
                assert time.monotonic() < deadline, "no checkpoint before the second command"
                time.sleep(0.01)
            assert len(points) == 1, points  # the first command made the sandbox: none then

            def shown() -> None:
                with sup.client() as shows:
                    shows.rollback_sandbox("src", apply=False)

            killed_once_written(sup, "~now-", shown)
        left = transient(sup)
        assert [n for n in left if n.startswith("~now-") and n.endswith(".json.gz")], (
            f"the control: {left}"
        )
        sup.start()
        with Snaps(sup.target) as snaps:
            snaps.snapshot("src", "after")  # the owner's next operation on its store
            assert transient(sup) == points, "the diff's capture went, the checkpoints stay"
        with sup.client() as c:
            undo = c.rollback_sandbox("src", apply=False)
            assert undo.counts == (0, 0, 2000), undo.counts
            assert transient(sup) == points, "a whole diff leaves nothing either"
