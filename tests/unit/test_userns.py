"""User namespaces without an engine: id maps and /etc/subuid parsing (table style, odd and
hostile input), the workspace hand-over walk, the manager's rules against a fake engine that
remaps, and the isolation report's maps."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from stockade.supervisor.config import Config, SandboxConfig, load_config
from stockade.supervisor.engines import isolation as iso
from stockade.supervisor.engines import procfs, userns
from stockade.supervisor.engines.backends._common import id_maps, view_from_inspect
from stockade.supervisor.engines.userns import (
    IDENTITY,
    IdMaps,
    IdRange,
    check_podman_subids,
    docker_remap,
    docker_remap_root,
    format_map,
    is_identity,
    parse_engine_map,
    parse_proc_map,
    parse_subid,
    to_host,
)
from stockade.supervisor.errors import ConfigError
from stockade.supervisor.keys import sandbox_id
from stockade.supervisor.sandboxes.hostfs import chown_tree, remove_tree
from stockade.supervisor.sandboxes.manager import SandboxManager
from tests.unit.fakes import FakeAgent, FakeBackend, fake_manager

AUTO = (IdRange(0, 2147483647, 65536),)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("         0 2147483647      65536\n", AUTO),
        ("0 0 4294967295\n", IDENTITY),
        ("0 100000 1000\n1000 5000 1\n1001 101001 64535\n",
         (IdRange(0, 100000, 1000), IdRange(1000, 5000, 1), IdRange(1001, 101001, 64535))),
        ("", ()),
        ("0 1\n", ()),  # too few fields
        ("0 1 2 3\n", ()),
        ("-1 0 10\n", ()),
        ("a b c\n", ()),
        ("0 0 0\n", ()),  # an empty range maps nothing
        ("0 4294967295 2\n", ()),  # past the last id
        ("0 99999999999999999999 1\n", ()),
        ("0 1 1\x00\n", ()),
    ],
)  # fmt: skip
def test_proc_maps(text: str, expected: tuple[IdRange, ...]) -> None:
    assert parse_proc_map(text) == expected


@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        (["0:2147483647:65536"], AUTO),
        (["0:1:1", "bad", "1:2", "x:y:z", 7], (IdRange(0, 1, 1),)),
        ("0:1:1", ()),  # not a list
        (None, ()),
        ([], ()),
    ],
)
def test_engine_maps(entries: object, expected: tuple[IdRange, ...]) -> None:
    assert parse_engine_map(entries) == expected


def test_mapping_ids() -> None:
    assert to_host(AUTO, 1000) == 2147484647
    assert to_host(AUTO, 65536) is None
    assert to_host(IDENTITY, 1000) == 1000
    assert is_identity(IDENTITY)
    assert not is_identity(AUTO)
    assert not is_identity(())
    assert format_map(AUTO) == "0:2147483647:65536"
    assert IdMaps(AUTO, AUTO).host_ids(1000, 1000) == (2147484647, 2147484647)
    with pytest.raises(ConfigError, match="not mapped"):
        IdMaps((IdRange(0, 100000, 1000),), AUTO).host_ids(1000, 1000)


SUBUID = """# comment
containers:2147483647:2147483648
dockremap:100000:65536

bad line
x:1
y:a:b
z:1:0
dockremap:300000:1000
"""


def test_subid_lines() -> None:
    assert parse_subid(SUBUID) == [
        ("containers", 2147483647, 2147483648),
        ("dockremap", 100000, 65536),
        ("dockremap", 300000, 1000),
    ]


@pytest.mark.parametrize(
    ("subuid", "subgid", "complaint"),
    [
        ("", "", "no entry"),
        ("other:100000:65536\n", "containers:1:65536\n", "/etc/subuid"),
        ("containers:1:65536\n", "", "/etc/subgid"),
        ("containers:1:1000\n", "containers:1:65536\n", "only 1000 ids"),
        ("#containers:1:65536\n", "containers:1:65536\n", "no entry"),
    ],
)
def test_podman_needs_a_containers_range(subuid: str, subgid: str, complaint: str) -> None:
    with pytest.raises(ConfigError, match=complaint) as info:
        check_podman_subids(subuid, subgid)
    assert "containers:2147483647:2147483648" in str(info.value)  # says how to fix it


def test_podman_range_may_be_split() -> None:
    check_podman_subids("containers:1:40000\ncontainers:900000:40000\n", "containers:1:65536\n")


def test_docker_remap_from_its_root_dir_and_subuid() -> None:
    assert docker_remap_root("/var/lib/docker/100000.100000") == (100000, 100000)
    for odd in ("/var/lib/docker", "/x/1.", "/x/.1", "/x/a.b", ""):
        assert docker_remap_root(odd) is None
    maps = docker_remap("/var/lib/docker/100000.100000", SUBUID, "dockremap:100000:65536\n")
    assert maps.uids == (IdRange(0, 100000, 65536), IdRange(65536, 300000, 1000))
    assert maps.gids == (IdRange(0, 100000, 65536),)
    with pytest.raises(ConfigError, match=r"UID\.GID"):
        docker_remap("/var/lib/docker", SUBUID, SUBUID)
    with pytest.raises(ConfigError, match="no range in /etc/subgid"):
        docker_remap("/var/lib/docker/100000.5", SUBUID, SUBUID)


# ---- the hand-over walk (as root: it changes owners)

OLD, NEW = (101000, 101000), (2147484647, 2147484647)


def owner(path: Path) -> tuple[int, int]:
    info = os.lstat(path)
    return info.st_uid, info.st_gid


def test_chown_tree_hands_over_the_old_owners_entries_only(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_text("host")
    os.chown(outside, *OLD)
    tree = tmp_path / "tree"
    (tree / "a" / "b").mkdir(parents=True)
    (tree / "a" / "b" / "f").write_text("x")
    os.symlink(outside, tree / "a" / "link")
    os.symlink(tmp_path, tree / "dir-link")
    os.mkfifo(tree / "a" / "fifo")
    (tree / "someone-else").write_text("y")
    for path in [tree, *tree.rglob("*")]:
        os.chown(path, *OLD, follow_symlinks=False)
    os.chown(tree / "someone-else", 4242, 4242)
    changed = chown_tree(tree, NEW, {OLD[0]}, {OLD[1]})
    assert changed == 7  # the root and six entries
    for path in ("a", "a/b", "a/b/f", "a/link", "dir-link", "a/fifo"):
        assert owner(tree / path) == NEW, path
    assert owner(tree) == NEW
    assert owner(tree / "someone-else") == (4242, 4242)
    assert owner(outside) == OLD, "a link's target is never changed"
    assert owner(tmp_path) == (0, 0)


def test_chown_tree_goes_deep_without_recursion(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    fd = os.open(tree, os.O_RDONLY)
    try:
        for _ in range(2000):
            os.mkdir("d", dir_fd=fd)
            os.chown("d", *OLD, dir_fd=fd)
            child = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = child
        os.close(os.open("leaf", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=fd))
        os.chown("leaf", *OLD, dir_fd=fd)
    finally:
        os.close(fd)
    try:
        assert chown_tree(tree, NEW, {OLD[0]}, {OLD[1]}) == 2002
        assert owner(Path(tree, *["d"] * 2000, "leaf")) == NEW
    finally:  # pytest's own clean-up of tmp_path recurses, and fails on such a tree
        remove_tree(tree)


def test_chown_tree_refuses_a_link_as_the_tree(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "tree")
    with pytest.raises(OSError, match=r"Too many levels|Not a directory"):
        chown_tree(tmp_path / "tree", NEW, {0}, {0})
    assert owner(tmp_path / "real") == (0, 0)


# ---- the manager, against a fake engine that remaps like dockerd


def manager(tmp_path: Path, backend: FakeBackend, *, userns: bool = False) -> SandboxManager:
    config = Config(
        state_dir=tmp_path, sandbox=SandboxConfig(user="1000:1000", user_namespace=userns)
    )
    return fake_manager(config, backend)


async def test_the_workspace_is_handed_to_the_mapped_ids_and_again_when_they_change(
    tmp_path: Path,
) -> None:
    backend = FakeBackend()
    backend.maps = IdMaps((IdRange(0, 100000, 65536),), (IdRange(0, 100000, 65536),))
    mgr = manager(tmp_path, backend, userns=True)
    await mgr.start()
    sandbox = await mgr.ensure("k")
    root = tmp_path / "sandboxes" / sandbox.sid
    assert owner(root / "workspace") == OLD
    assert (root / "owner").read_text() == "101000:101000\n"
    assert stat.S_IMODE(os.stat(root / "run").st_mode) == 0o755  # sealed after the start
    (root / "workspace" / "f").write_text("x")
    os.chown(root / "workspace" / "f", *OLD)
    os.symlink("/etc/passwd", root / "workspace" / "l")
    os.chown(root / "workspace" / "l", *OLD, follow_symlinks=False)
    backend.maps = IdMaps((IdRange(0, 2147483647, 65536),), (IdRange(0, 2147483647, 65536),))
    backend.kill(sandbox.info.id)
    await mgr.ensure("k")
    assert owner(root / "workspace") == NEW
    assert owner(root / "workspace" / "f") == NEW
    assert owner(root / "workspace" / "l") == NEW
    assert owner(Path("/etc/passwd")) == (0, 0)
    assert (root / "owner").read_text() == "2147484647:2147484647\n"


async def test_a_half_done_hand_over_is_finished_next_time(tmp_path: Path) -> None:
    """The supervisor died during a walk: the record lists both owners, so entries still
    owned by either are handed to the ids of the next container."""
    backend = FakeBackend()
    backend.maps = IdMaps(AUTO, AUTO)
    mgr = manager(tmp_path, backend, userns=True)
    await mgr.start()
    sandbox = await mgr.ensure("k")
    root = tmp_path / "sandboxes" / sandbox.sid
    for name, ids in (("done", NEW), ("not-yet", OLD)):
        (root / "workspace" / name).write_text(name)
        os.chown(root / "workspace" / name, *ids)
    (root / "owner").write_text("101000:101000\n2147484647:2147484647\n")
    backend.maps = IdMaps((IdRange(0, 200000, 65536),), (IdRange(0, 200000, 65536),))
    backend.kill(sandbox.info.id)
    await mgr.ensure("k")
    assert owner(root / "workspace" / "done") == (201000, 201000)
    assert owner(root / "workspace" / "not-yet") == (201000, 201000)


async def test_without_user_namespaces_nothing_is_walked(tmp_path: Path) -> None:
    backend = FakeBackend()
    mgr = manager(tmp_path, backend)
    await mgr.start()
    sandbox = await mgr.ensure("k")
    root = tmp_path / "sandboxes" / sandbox.sid
    assert owner(root / "workspace") == (1000, 1000)
    assert not (root / "owner").exists()


async def test_turning_user_namespaces_on_replaces_sandboxes_without_one(tmp_path: Path) -> None:
    backend = FakeBackend()
    backend.per_container = True
    first = manager(tmp_path, backend)
    plain = await first.ensure("plain")
    await first.close()
    second = manager(tmp_path, backend, userns=True)
    assert await second.start() == []
    assert plain.info.id not in backend.containers
    remade = await second.ensure("plain")
    assert backend.containers[remade.info.id].own_userns
    await second.close()
    third = manager(tmp_path, backend, userns=True)
    assert await third.start() == ["plain"], "one with a namespace is adopted"


async def test_user_namespaces_on_an_engine_without_them_refuse_to_start(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no user namespaces"):
        await manager(tmp_path, FakeBackend(), userns=True).start()


@pytest.mark.parametrize(
    ("engine", "gvisor", "host", "subuid", "refusal"),
    [
        ("podman", False, True, "containers:2147483647:2147483648\n", None),
        ("docker", False, True, "containers:2147483647:2147483648\n", "daemon-wide"),
        ("podman", True, True, "containers:2147483647:2147483648\n", "gVisor"),
        ("podman", False, False, "containers:2147483647:2147483648\n", "in a container"),
        ("podman", False, True, "", "no entry"),
        ("podman", False, True, "containers:100000:1000\n", "only 1000 ids"),
    ],
)
def test_unset_user_namespace_is_on_where_each_sandbox_gets_a_range(
    monkeypatch: pytest.MonkeyPatch,
    engine: str,
    gvisor: bool,
    host: bool,
    subuid: str,
    refusal: str | None,
) -> None:
    monkeypatch.setattr(userns, "read_host_file", lambda _path: subuid)
    found = userns.auto_refusal(engine, gvisor, host)
    assert found == refusal if refusal is None else refusal in (found or "")


async def test_unset_user_namespace_off_says_so_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = Config(state_dir=tmp_path)  # the defaults: 65532:65532, user_namespace unset
    mgr = fake_manager(
        config, FakeBackend(), connect=lambda address: FakeAgent(FakeBackend(), address)
    )
    with caplog.at_level("WARNING"):
        await mgr.start()
    assert "sandboxes run without a user namespace (fake has user namespaces only" in caplog.text
    assert "uid 65532:65532 on the host" in caplog.text
    await mgr.close()


async def test_a_workspace_of_an_earlier_default_user_is_handed_over(tmp_path: Path) -> None:
    """Made by a version that ran sandboxes as 1000 (no owners record): the workspace's own
    owner tells whose files to hand to the configured user; root's files stay root's."""
    backend = FakeBackend()
    config = Config(state_dir=tmp_path, sandbox=SandboxConfig(user_namespace=False))
    mgr = fake_manager(config, backend)
    await mgr.start()
    root = tmp_path / "sandboxes" / sandbox_id("old")
    workspace = root / "workspace"
    workspace.mkdir(parents=True)
    (workspace / "f").write_text("x")
    (workspace / "r").write_text("root's")
    for path in (workspace, workspace / "f"):
        os.chown(path, 1000, 1000)
    await mgr.ensure("old")
    assert owner(workspace) == owner(workspace / "f") == (65532, 65532)
    assert owner(workspace / "r") == (0, 0)
    await mgr.close()


def test_config_option_is_a_bool(tmp_path: Path) -> None:
    assert not Config().sandbox.user_namespace
    path = tmp_path / "c.toml"
    path.write_text('[sandbox]\nuser_namespace = "yes"\n')
    with pytest.raises(ConfigError, match=r"sandbox\.user_namespace must be bool"):
        load_config(path)
    path.write_text("[sandbox]\nuser_namespace = true\n")
    assert load_config(path).sandbox.user_namespace


# ---- the report


def test_inside_view_reads_the_maps() -> None:
    def view(uid_map: bytes | str, gid_map: bytes | str) -> iso.InsideView:
        files: dict[str, bytes | str] = {procfs.UID_MAP: uid_map, procfs.GID_MAP: gid_map}
        return iso.inside_view(iso.InsideFacts(files, {}, True, ""))

    remapped = view(b"0 2147483647 65536\n", b"0 2147483647 65536\n")
    assert remapped.uid_map == AUTO
    assert remapped.user_namespace
    host = view(b"         0          0 4294967295\n", b"0 0 4294967295\n")
    assert host.uid_map == IDENTITY
    assert not host.user_namespace
    unread = view("EACCES", b"garbage")
    assert not unread.user_namespace
    assert f"{procfs.UID_MAP}: EACCES" in unread.problems


def test_engine_views_of_user_namespaces() -> None:
    podman = {"HostConfig": {"UsernsMode": "", "IDMappings": {
        "UidMap": ["0:2147483647:65536"], "GidMap": ["0:2147483647:65536"]}}}  # fmt: skip
    view = view_from_inspect(podman, "x")
    assert (view.userns_mode, view.uid_map, view.gid_map) == ("private", AUTO, AUTO)
    assert id_maps(podman) == IdMaps(AUTO, AUTO)
    assert id_maps({"HostConfig": {"IDMappings": "odd"}}) == IdMaps(IDENTITY, IDENTITY)
    assert view_from_inspect({"HostConfig": {"UsernsMode": "host"}}, "x").userns_mode == "host"
