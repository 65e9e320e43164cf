"""User namespaces: id maps, the /etc/subuid ranges they come from, and which host ids a
sandbox's user has. Pure parsing, plus two small readers of host files; no SDK, no gRPC.

A map is a tuple of IdRange (container id, host id, count), the shape of
/proc/PID/uid_map, of Podman's inspect ("0:2147483647:65536") and of Docker's
userns-remap (the remap user's /etc/subuid ranges, laid end to end from container id 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from stockade.supervisor.engines import hosts
from stockade.supervisor.errors import ConfigError

SUBUID = Path("/etc/subuid")
SUBGID = Path("/etc/subgid")
PODMAN_SUBID_USER = "containers"
"""The name Podman's `--userns=auto` allocates ranges from (rootful)."""
AUTO_SIZE = 65536
"""Ids each sandbox's namespace gets: every uid and gid a Debian image uses."""
MAX_ID = 0xFFFFFFFE
"""(uid_t)-1 is "no id"; the largest valid one is one less."""


@dataclass(frozen=True)
class IdRange:
    inside: int
    host: int
    count: int


IdMap = tuple[IdRange, ...]
IDENTITY: IdMap = (IdRange(0, 0, MAX_ID + 1),)
"""What /proc/self/uid_map says without a user namespace: all ids, unchanged."""


@dataclass(frozen=True)
class IdMaps:
    uids: IdMap
    gids: IdMap

    def host_ids(self, uid: int, gid: int) -> tuple[int, int]:
        """The host ids of container uid:gid; ConfigError when either is not mapped."""
        host_uid, host_gid = to_host(self.uids, uid), to_host(self.gids, gid)
        if host_uid is None or host_gid is None:
            raise ConfigError(
                f"the sandbox user {uid}:{gid} is not mapped by the user namespace "
                f"(uid map {format_map(self.uids)}, gid map {format_map(self.gids)})"
            )
        return host_uid, host_gid


NO_USERNS = IdMaps(IDENTITY, IDENTITY)


def _range(inside: int, host: int, count: int) -> IdRange | None:
    ok = count > 0 and min(inside, host) >= 0 and max(inside, host) + count - 1 <= MAX_ID + 1
    return IdRange(inside, host, count) if ok else None


def parse_proc_map(text: str) -> IdMap:
    """/proc/PID/uid_map or gid_map: "inside host count" per line; odd lines are skipped."""
    found = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 3 and all(f.isdigit() for f in fields):
            item = _range(*(int(f) for f in fields))
            if item is not None:
                found.append(item)
    return tuple(found)


def parse_engine_map(entries: object) -> IdMap:
    """Podman's inspect HostConfig.IDMappings.UidMap: ["inside:host:count", ...]."""
    if not isinstance(entries, list):
        return ()
    found = []
    for entry in entries:
        fields = str(entry).split(":")
        if len(fields) == 3 and all(f.isdigit() for f in fields):
            item = _range(*(int(f) for f in fields))
            if item is not None:
                found.append(item)
    return tuple(found)


def format_map(ranges: IdMap) -> str:
    return ",".join(f"{r.inside}:{r.host}:{r.count}" for r in ranges) or "(empty)"


def is_identity(ranges: IdMap) -> bool:
    return all(r.inside == r.host for r in ranges) and bool(ranges)


def to_host(ranges: IdMap, inside: int) -> int | None:
    for r in ranges:
        if r.inside <= inside < r.inside + r.count:
            return r.host + inside - r.inside
    return None


def parse_subid(text: str) -> list[tuple[str, int, int]]:
    """/etc/subuid or /etc/subgid: "name:start:count" per line (comments and odd lines
    skipped, as shadow's tools do)."""
    found = []
    for line in text.splitlines():
        fields = line.strip().split(":")
        if line.lstrip().startswith("#") or len(fields) != 3:
            continue
        name, start, count = fields
        if name and start.isdigit() and count.isdigit() and int(count) > 0:
            found.append((name, int(start), int(count)))
    return found


def subid_ranges(text: str, name: str) -> list[tuple[int, int]]:
    """(start, count) of every range of `name`, in file order."""
    return [(start, count) for who, start, count in parse_subid(text) if who == name]


def laid_end_to_end(ranges: list[tuple[int, int]]) -> IdMap:
    """Docker's remap: the remap user's ranges in file order, from container id 0 on."""
    found, inside = [], 0
    for start, count in ranges:
        found.append(IdRange(inside, start, count))
        inside += count
    return tuple(found)


def docker_remap_root(root_dir: str) -> tuple[int, int] | None:
    """The remapped root's host ids from Docker's DockerRootDir ("/var/lib/docker/231072.231072":
    dockerd keeps a data root per remap, named after its root's uid.gid)."""
    uid, sep, gid = Path(root_dir).name.partition(".")
    return (int(uid), int(gid)) if sep and uid.isdigit() and gid.isdigit() else None


def docker_remap(root_dir: str, subuid: str, subgid: str) -> IdMaps:
    """A remapping dockerd's id maps: the /etc/subuid and /etc/subgid ranges of the user whose
    first range starts at the remapped root (read from DockerRootDir)."""
    root = docker_remap_root(root_dir)
    if root is None:
        raise ConfigError(
            f"Docker remaps user namespaces, but its data root {root_dir!r} does not end in "
            "UID.GID, so the remapped ids are unknown"
        )
    maps = []
    for text, start, what in ((subuid, root[0], "/etc/subuid"), (subgid, root[1], "/etc/subgid")):
        owners = [name for name, first, _count in parse_subid(text) if first == start]
        if not owners:
            raise ConfigError(
                f"Docker remaps its root to {start}, but no range in {what} starts there "
                "(does the supervisor run on the engine's host?)"
            )
        maps.append(laid_end_to_end(subid_ranges(text, owners[0])))
    return IdMaps(maps[0], maps[1])


def check_podman_subids(subuid: str, subgid: str) -> None:
    """ConfigError unless /etc/subuid and /etc/subgid give Podman's `containers` user room for
    at least one automatic namespace."""
    for text, path in ((subuid, SUBUID), (subgid, SUBGID)):
        total = sum(count for _start, count in subid_ranges(text, PODMAN_SUBID_USER))
        if total < AUTO_SIZE:
            have = f"only {total} ids" if total else "no entry"
            raise ConfigError(
                f"sandbox.user_namespace needs a '{PODMAN_SUBID_USER}' range of at least "
                f"{AUTO_SIZE} ids in {path} for Podman's automatic user namespaces, but it has "
                f"{have}; add e.g. '{PODMAN_SUBID_USER}:2147483647:2147483648' to {SUBUID} and "
                f"{SUBGID} (scripts/setup.sh does)"
            )


def read_host_file(path: Path) -> str:
    """A host file's text; "" when it does not exist."""
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def auto_refusal(engine: str, gvisor: bool, host_mounts: bool) -> str | None:
    """Why sandbox.user_namespace, left unset, is off; None when it is on: Podman on the host
    (not from the supervisor's container, which sees neither /etc/subuid nor the host's
    /proc), not under gVisor, with a `containers` range of ids to allocate from."""
    if not hosts.of_engine(engine).on_this_machine:
        return "pods run as the sandbox uid under the cluster's own user namespace policy"
    if engine != "podman":
        return f"{engine} has user namespaces only daemon-wide (userns-remap)"
    if gvisor:
        return "gVisor is untested with them"
    if not host_mounts:
        return "the supervisor runs in a container"
    try:
        check_podman_subids(read_host_file(SUBUID), read_host_file(SUBGID))
    except ConfigError as exc:
        return str(exc)
    return None
