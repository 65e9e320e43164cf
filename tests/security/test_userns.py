"""sandbox.user_namespace: a sandbox's uids are unprivileged host ids of no host user.

Podman gives each sandbox a range of its own (`--userns=auto`, from the `containers` entry
scripts/setup.sh puts in /etc/subuid); Docker's remap is the daemon's, so these tests run a
private dockerd with `--userns-remap=default` (its own data root and bridge: the shared
dockerd is left as it is). Each check is made from the host side, on the real files and
processes, not only from what the sandbox says."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stockade.client import Sandbox, Stockade
from stockade.supervisor.cli import launcher
from stockade.supervisor.config import AGENT_UID
from stockade.supervisor.engines.backends import create_backend
from stockade.supervisor.engines.userns import IDENTITY, IdMap, parse_proc_map, to_host
from stockade.supervisor.sandboxes import hostfs, workspaces
from tests.integration.harness import (
    NO_AUTH,
    SANDBOX_UID,
    PrivateEngine,
    Supervisor,
    bring_up,
    engine_url,
)

pytestmark = pytest.mark.timeout(600)

USERNS = "[sandbox]\nuser_namespace = true\n"


class Setup:
    """A supervisor with user namespaces on, and the engine address it uses."""

    def __init__(self, sup: Supervisor, url: str) -> None:
        self.sup, self.url = sup, url

    def remove_container(self, client: Stockade, key: str) -> None:
        backend = create_backend(self.sup.engine, self.url)
        try:
            assert backend.remove(client.get_sandbox(key).container_id)
        finally:
            backend.close()


@pytest.fixture(scope="module")
def setup(engine: str) -> Iterator[Setup]:
    private = None
    if engine == "docker":
        private = PrivateEngine(
            "docker", Path(tempfile.mkdtemp(prefix="stke", dir="/tmp")), userns_remap=True,
            bridge="stkuserns0",
        )  # fmt: skip
    state = Path(tempfile.mkdtemp(prefix="stk", dir="/tmp"))
    try:
        if private is not None:
            private.start()
        url = private.url if private is not None else engine_url(engine)
        sup = Supervisor(engine, state, USERNS, engine_socket=url)
        sup.start()
        try:
            yield Setup(sup, url)
        finally:
            sup.stop()
            launcher.remove_instance_containers(engine, url, state)
    finally:
        workspaces.unmount_all(state)
        hostfs.remove_tree(state)
        if private is not None:
            private.close()


@pytest.fixture
def client(setup: Setup) -> Iterator[Stockade]:
    with setup.sup.client() as c:
        yield c


def sh(box: Sandbox, command: str) -> str:
    result = box.exec(command, timeout=60)
    assert result.exit_code == 0, f"{command!r}: {result.stdout} {result.stderr}"
    return result.stdout


def uid_map(box: Sandbox) -> IdMap:
    return parse_proc_map(sh(box, "cat /proc/self/uid_map"))


def host_uid(box: Sandbox) -> int:
    mapped = to_host(uid_map(box), SANDBOX_UID)
    assert mapped is not None
    return mapped


def test_the_sandbox_runs_in_a_user_namespace_seen_from_both_sides(
    client: Stockade, key: str
) -> None:
    box = client.sandbox(key)
    inside = uid_map(box)
    assert inside
    assert all(r.inside != r.host for r in inside), inside
    assert parse_proc_map(sh(box, "cat /proc/self/gid_map")) not in (IDENTITY, ())
    mapped = host_uid(box)
    assert mapped not in (0, SANDBOX_UID)
    with pytest.raises(KeyError):  # no host account has it
        pwd.getpwuid(mapped)
    # the container's init (stockade-agent), as the host's kernel sees it
    pid = client.inspect_isolation(key).outside["host_pid"]
    status = Path(f"/proc/{pid}/status").read_text()
    uids = next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1:]
    assert set(map(int, uids)) == {to_host(inside, AGENT_UID)}
    assert parse_proc_map(Path(f"/proc/{pid}/uid_map").read_text()) == inside


def test_files_the_sandbox_makes_belong_to_the_mapped_ids_on_the_host(
    setup: Setup, client: Stockade, key: str
) -> None:
    box = client.sandbox(key)
    sh(box, "mkdir -p d && touch d/by-exec && ln -s /etc/shadow d/link")
    assert sh(box, "echo t > /tmp/t && cat /tmp/t") == "t\n", "/tmp (Podman: a tmpfs of ours)"
    box.write_file("by-tool.txt", "x")
    mapped = host_uid(box)
    workspace = setup.sup.workspace(key)
    for path in ("d", "d/by-exec", "d/link", "by-tool.txt", "."):
        info = os.lstat(workspace / path)
        assert (info.st_uid, info.st_gid) != (SANDBOX_UID, SANDBOX_UID)
        assert info.st_uid == mapped, path
        assert info.st_uid != 0
        assert info.st_gid != 0


def test_files_of_the_host_uid_of_the_sandbox_users_number_are_out_of_reach(
    setup: Setup, client: Stockade, key: str
) -> None:
    """Without a user namespace, sandbox uid 65532 is host uid 65532 (once 1000, the first
    human account of most hosts). With one, a file of that host uid (0600) placed in the
    workspace is a stranger's: unreadable, unwritable, and its owner cannot be taken."""
    box = client.sandbox(key)
    sh(box, "true")
    victim = setup.sup.workspace(key) / "host-1000-secret"
    victim.write_text("secret of host uid 1000\n")
    os.chown(victim, SANDBOX_UID, SANDBOX_UID)
    victim.chmod(0o600)
    result = box.exec("cat host-1000-secret; echo more >> host-1000-secret; "
                      "chmod 666 host-1000-secret; stat -c '%u:%g' host-1000-secret")  # fmt: skip
    assert "secret" not in result.stdout
    assert result.stderr.count("Permission denied") >= 1
    assert "Operation not permitted" in result.stderr
    assert result.stdout.strip() == "65534:65534", "an unmapped owner shows as nobody"
    assert victim.read_text() == "secret of host uid 1000\n"
    assert oct(victim.stat().st_mode & 0o777) == "0o600"
    attempts = box.exec("chown 0 by-me 2>&1; touch by-me; chown 0:0 by-me; "
                        "python3 -c 'import os; os.setuid(0)'")  # fmt: skip
    assert attempts.exit_code != 0
    assert "Operation not permitted" in attempts.stderr + attempts.stdout


def test_each_podman_sandbox_has_a_range_of_its_own(
    engine: str, client: Stockade, key: str
) -> None:
    first, second = host_uid(client.sandbox(key)), host_uid(client.sandbox(key + "-b"))
    if engine == "podman":
        assert abs(first - second) >= 65536, "ranges of different sandboxes never overlap"
    else:  # Docker's remap is one range for the whole daemon
        assert first == second


def test_the_workspace_survives_recreation_in_another_range(
    setup: Setup, client: Stockade, key: str, tmp_path: Path
) -> None:
    """The container is removed; meanwhile another sandbox takes its range (Podman hands out
    the lowest free one), so the next call makes a container with another range, and the
    workspace is walked and handed over. A link planted in it is changed itself: the host file
    it points at, owned by the old ids, keeps its owner."""
    box = client.sandbox(key)
    old = host_uid(box)
    bystander = tmp_path / "bystander"
    bystander.write_text("host file\n")
    os.chown(bystander, old, old)
    sh(box, f"mkdir -p a/b/c && echo deep > a/b/c/f && echo top > top && chmod 600 top "
            f"&& ln -s {bystander} a/link && mkfifo a/fifo")  # fmt: skip
    setup.remove_container(client, key)
    if setup.sup.engine == "podman":
        host_uid(client.sandbox(key + "-taker"))  # takes the freed range
    assert sh(box, "cat a/b/c/f top") == "deep\ntop\n"
    new = host_uid(box)
    if setup.sup.engine == "podman":
        assert new != old
    sh(box, "echo more >> top && rm a/b/c/f && touch a/b/c/g && rm a/fifo")
    workspace = setup.sup.workspace(key)
    for path in ("a", "a/b/c", "a/b/c/g", "top", "a/link"):
        assert os.lstat(workspace / path).st_uid == new, path
    assert (bystander.stat().st_uid, bystander.stat().st_gid) == (old, old)
    assert bystander.read_text() == "host file\n"


def test_destroy_with_the_workspace_removes_the_mapped_files(
    setup: Setup, client: Stockade, key: str
) -> None:
    box = client.sandbox(key)
    sh(box, "mkdir -p x/y && echo z > x/y/z && chmod 000 x/y && ln -s / x/root")
    workspace = setup.sup.workspace(key)
    assert client.destroy_sandbox(key, delete_workspace=True)
    assert not workspace.exists()
    assert not workspace.parent.exists()
    assert Path("/etc/passwd").exists()
    assert sh(client.sandbox(key), "ls -A | wc -l") == "0\n", "a new, empty workspace"


def test_doctor_reports_the_user_namespace(setup: Setup, client: Stockade, key: str) -> None:
    box = client.sandbox(key)
    inside = uid_map(box)
    report = client.inspect_isolation(key)
    ranges = [(r["inside"], r["host"], r["count"]) for r in report.inside["uid_map"]]
    assert ranges == [(r.inside, r.host, r.count) for r in inside]
    assert report.inside["user_namespace"] is True
    outside = report.outside
    assert outside["userns_mode"] == ("private" if setup.sup.engine == "podman" else "remap")
    assert [(r["inside"], r["host"], r["count"]) for r in outside["uid_map"]] == ranges
    user_ns = next(n for n in report.namespaces if n["type"] == "user")
    assert user_ns["private"] is True
    env = {**os.environ, "STOCKADE_ADDR": setup.sup.target}
    done = subprocess.run(
        [sys.executable, "-m", "stockade.supervisor.cli", "doctor", "--sandbox", key],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    first = inside[0]
    assert f"user ns       yes: uid map {first.inside}:{first.host}:{first.count}" in done.stdout
    assert f"userns {outside['userns_mode']}" in done.stdout


def test_a_capped_workspace_is_handed_over_too(setup: Setup, key: str) -> None:
    """sandbox.workspace_size_mb: the ext4 file system made for the workspace gets its root
    handed to the mapped ids before the container starts, and keeps its cap."""
    state = Path(tempfile.mkdtemp(prefix="stk", dir="/tmp"))
    capped = USERNS + "workspace_size_mb = 32\n"
    sup = Supervisor(setup.sup.engine, state, capped, engine_socket=setup.url)
    sup.start()
    try:
        with sup.client() as c:
            box = c.sandbox(key)
            mapped = host_uid(box)
            sh(box, "echo x > f && mkdir d")
            assert sup.workspace(key).is_mount()
            for path in (".", "f", "d"):
                assert os.lstat(sup.workspace(key) / path).st_uid == mapped, path
            fill = box.exec("head -c 64M /dev/zero > big", timeout=120)
            assert "No space left on device" in fill.stderr
    finally:
        sup.stop()
        launcher.remove_instance_containers(setup.sup.engine, setup.url, state)
        workspaces.unmount_all(state)
        hostfs.remove_tree(state)


def test_a_remapping_dockerd_is_used_with_the_option_off(setup: Setup, key: str) -> None:
    """Docker's remap applies to every container: with sandbox.user_namespace off the
    supervisor still hands the workspace to the remapped ids (or nothing could write it), and
    says so in its log."""
    if setup.sup.engine != "docker":
        pytest.skip("only Docker remaps daemon-wide")
    state = Path(tempfile.mkdtemp(prefix="stk", dir="/tmp"))
    sup = Supervisor("docker", state, "", engine_socket=setup.url)
    sup.start()
    try:
        with sup.client() as c:
            box = c.sandbox(key)
            mapped = host_uid(box)
            assert mapped != SANDBOX_UID
            sh(box, "echo x > f")
            assert os.lstat(sup.workspace(key) / "f").st_uid == mapped
            assert c.inspect_isolation(key).outside["userns_mode"] == "remap"
        assert "remaps user namespaces for every container" in sup.log()
    finally:
        sup.stop()
        launcher.remove_instance_containers("docker", setup.url, state)
        workspaces.unmount_all(state)
        hostfs.remove_tree(state)


def test_a_warm_pool_container_is_handed_over_before_it_starts(setup: Setup, key: str) -> None:
    """housekeeping.warm_pool: a pool container gets its folder handed to its ids like any
    other; the key that takes it writes there, and it is the pool's container."""
    state = Path(tempfile.mkdtemp(prefix="stk", dir="/tmp"))
    pooled = USERNS + "[housekeeping]\nsweep_interval_s = 0.2\nwarm_pool = 1\n"
    sup = Supervisor(setup.sup.engine, state, pooled, engine_socket=setup.url)
    sup.start()
    try:
        deadline = time.monotonic() + 120
        while "warm pool: container" not in sup.log():
            assert time.monotonic() < deadline, sup.log()[-3000:]
            time.sleep(0.2)
        with sup.client() as c:
            box = c.sandbox(key)
            sh(box, "echo hi > f")
            mapped = host_uid(box)
            assert mapped != SANDBOX_UID
            assert os.lstat(sup.workspace(key) / "f").st_uid == mapped
            assert "took warm-pool container" in sup.log()
    finally:
        sup.stop()
        launcher.remove_instance_containers(setup.sup.engine, setup.url, state)
        workspaces.unmount_all(state)  # Podman's /tmp tmpfs of the pool's next container
        hostfs.remove_tree(state)


def test_a_restarted_supervisor_adopts_userns_sandboxes(
    setup: Setup, client: Stockade, key: str
) -> None:
    box = client.sandbox(key)
    sh(box, "echo kept > kept")
    before = client.get_sandbox(key).container_id
    inside = uid_map(box)
    setup.sup.stop()
    setup.sup.start()
    with setup.sup.client() as again:
        again_box = again.sandbox(key)
        assert sh(again_box, "cat kept") == "kept\n"
        assert again.get_sandbox(key).container_id == before, "adopted, not re-made"
        assert uid_map(again_box) == inside
        assert again.inspect_isolation(key).inside["user_namespace"] is True


def test_docker_without_remap_refuses_to_start_with_user_namespaces(engine: str) -> None:
    """The shared dockerd does not remap: asked for user namespaces, serve stops at once
    saying how to turn remapping on."""
    if engine != "docker":
        pytest.skip("Podman's namespaces are per container (its refusal is a unit test)")
    bring_up("docker")
    state = Path(tempfile.mkdtemp(prefix="stk", dir="/tmp"))
    try:
        config = state / "c.toml"
        config.write_text(
            f'listen = "unix:{state}/api.sock"\nstate_dir = "{state}"\n'
            f'[engine]\nkind = "docker"\nsocket = "{engine_url("docker")}"\n{USERNS}{NO_AUTH}'
        )
        done = subprocess.run(
            [sys.executable, "-m", "stockade.supervisor.cli", "serve", "--config", str(config)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode != 0
        assert '"userns-remap": "default"' in done.stderr
        assert "does not remap" in done.stderr
        assert "Traceback" not in done.stderr
    finally:
        hostfs.remove_tree(state)


def test_doctor_checks_the_machine_for_user_namespaces(engine: str, tmp_path: Path) -> None:
    """Podman: the `containers` range scripts/setup.sh adds. Docker: the shared dockerd does
    not remap, and doctor says how to make it."""
    bring_up(engine)
    config = tmp_path / "c.toml"
    config.write_text(
        f'state_dir = "{tmp_path}"\n[engine]\nkind = "{engine}"\n'
        f'socket = "{engine_url(engine)}"\n{USERNS}'
    )
    done = subprocess.run(
        [sys.executable, "-m", "stockade.supervisor.cli", "doctor", "--config", str(config)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    line = next(x for x in done.stdout.splitlines() if "user namespaces:" in x)
    if engine == "podman":
        assert line.startswith("[ok  ]"), done.stdout
        assert "'containers' range" in line
    else:
        assert line.startswith("[FAIL]"), done.stdout
        assert "does not remap" in line
        assert done.returncode == 1
        assert 'fix: add "userns-remap": "default"' in done.stdout
