"""A supervisor killed in the middle of a fork (SIGKILL once the fork's transient capture is
written, while its new sandboxes are being made), on both engines: the capture is left in
the tenant's store, counted in its bytes; after the restart the tenant's next snapshot
operation removes it and the content only it used (SnapshotStore.hold_transient: the fork's
lock on it died with its process). The control is the store as the kill left it."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from tests.integration.harness import Supervisor, running_supervisor
from tests.integration.snapshot_kit import Snaps

pytestmark = pytest.mark.timeout(300)

MANY = r"""set -e
mkdir -p many && cd many
for d in $(seq 1 20); do mkdir d$d; for f in $(seq 1 100); do echo "$d $f" > d$d/f$f; done; done
"""
FORKS = 10


def transient(sup: Supervisor) -> list[str]:
    """The store's files of transient captures (their manifests and lock files)."""
    return sorted(p.name for p in (sup.state_dir / "snapshots").glob("*/manifests/~*"))


def test_a_fork_cut_by_the_supervisor_s_death_is_removed_after_the_restart(
    engine: str,
) -> None:
    with running_supervisor(engine) as sup:
        with sup.client() as c:
            assert c.sandbox("src").exec(MANY).exit_code == 0
        failed: list[BaseException] = []

        def fork() -> None:
            try:
                with Snaps(sup.target) as snaps:
                    snaps.fork("src", [f"f{i}" for i in range(FORKS)])
            except BaseException as exc:  # the supervisor dies under it
                failed.append(exc)

        forking = threading.Thread(target=fork)
        forking.start()
        deadline = time.monotonic() + 120
        while not any(n.endswith(".json.gz") for n in transient(sup)):
            assert time.monotonic() < deadline, "the fork's capture was never written"
            assert forking.is_alive(), f"the fork ended before it could be cut: {failed}"
            time.sleep(0.002)
        sup.stop(signal.SIGKILL)
        forking.join(60)
        assert failed, "the fork did not fail with its supervisor"
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
