"""A size-capped workspace (sandbox.workspace_size_mb) is a file system of its own that keeps
its files across container re-creation and supervisor restarts; destroying the sandbox
unmounts it, deleting the workspace deletes its image."""

from __future__ import annotations

import pytest

from tests.integration.harness import backend, running_supervisor

pytestmark = pytest.mark.timeout(300)
CAPPED = "[sandbox]\nworkspace_size_mb = 32\n"


def test_capped_workspace_lives_as_long_as_the_sandbox(engine: str) -> None:
    with running_supervisor(engine, extra_config=CAPPED) as sup:
        workspace = sup.workspace("q")
        image = workspace.parent / "workspace.img"
        with sup.client() as c:
            box = c.sandbox("q")
            box.write_file("kept.txt", "kept")
            assert workspace.is_mount()
            assert box.exec("df -k --output=size . | tail -1").stdout.strip().isdigit()
            engine_api = backend(engine)
            try:
                (info,) = engine_api.list({"io.stockade.key": "q"})
                engine_api.remove(info.id)  # the container dies; the next call makes a new one
            finally:
                engine_api.close()
            box.exec("true")  # SANDBOX_LOST or a fresh container
            assert box.read_file("kept.txt") == "kept"
        sup.stop()
        sup.start()
        with sup.client() as c:
            box = c.sandbox("q")
            assert box.read_file("kept.txt") == "kept"
            size = int(box.exec("df -k --output=size /workspace | tail -1").stdout)
            assert 24 * 1024 < size <= 32 * 1024
            assert c.destroy_sandbox("q") is True
            assert not workspace.is_mount()
            assert image.exists()
            assert box.read_file("kept.txt") == "kept", "mounted again for the new container"
            c.destroy_sandbox("q", delete_workspace=True)
            assert not workspace.is_mount()
            assert not image.exists()


def test_capping_an_existing_workspace_keeps_its_files(engine: str) -> None:
    with running_supervisor(engine) as sup:
        with sup.client() as c:
            box = c.sandbox("grown")
            box.write_file("sub/old.txt", "from before the cap")
            box.exec("ln -s sub/old.txt link")
        sup.stop()
        sup.extra_config = CAPPED
        sup.start()
        with sup.client() as c:
            box = c.sandbox("grown")
            assert box.read_file("sub/old.txt") == "from before the cap"
            assert box.exec("readlink link").stdout == "sub/old.txt\n"
            assert sup.workspace("grown").is_mount()
            assert box.exec("stat -c %U sub/old.txt .").stdout == "sandbox\nsandbox\n"
