"""Adoption at start: this instance's containers that still run are taken back as its
sandboxes (after a restart of the supervisor), re-created on their profile's image when they
run another (or were made with another profile than their key keeps), or removed when they
cannot be proven to be ours and sound."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from pathlib import Path

from stockade.supervisor.engines.backends.base import (
    LABEL_INSTANCE,
    LABEL_KEY,
    LABEL_POOL,
    LABEL_PROFILE,
    LABEL_SANDBOX_ID,
    ContainerInfo,
)
from stockade.supervisor.errors import NotFound, SandboxBroken
from stockade.supervisor.keys import sandbox_id, shown
from stockade.supervisor.sandboxes import layout, quarantine
from stockade.supervisor.sandboxes.layout import POOL_PREFIX
from stockade.supervisor.sandboxes.parts import Parts
from stockade.supervisor.sandboxes.profiles import SandboxProfile
from stockade.supervisor.sandboxes.sandbox import (
    Container,
    Sandbox,
    SandboxNetwork,
    born,
    labelled_key,
)

log = logging.getLogger("stockade")


async def adopt_all(
    parts: Parts, found: list[ContainerInfo], image_ids: Mapping[str, str | None]
) -> list[str]:
    """Adopt (or re-create) each of `found` that serves a key; remove the others. The keys
    adopted. With a shared host kind (pods) other replicas may be making or using what is
    found, outside any lock this start holds: running ones are adopted as they are and
    nothing is removed or re-made (a key's next call, under its lock, takes over or replaces
    its pod: take_over)."""
    pooled = parts.layout.pool_folders()
    adopted: list[str] = []
    for info in found:
        key = key_of(info, pooled)
        if parts.host.shared:
            if key is not None and await _adopt_remote(parts, key, info):
                adopted.append(key)
            continue
        outcome = await _adopt(parts, key, info, image_ids) if key is not None else ""
        if not outcome and key is not None and quarantine.kept(parts.layout.of(key).root):
            outcome = "kept"  # evidence: a quarantined key's container stays until destroyed
        if outcome == "adopted" and key is not None:
            adopted.append(key)
        elif not outcome:
            await asyncio.to_thread(parts.backend.remove, info.id)
    return adopted


async def _adopt_remote(parts: Parts, key: str, info: ContainerInfo) -> bool:
    """A running pod of the key, with the network and profile its labels say (a replica has
    no folder keeping them), greeted at its first call as any adopted sandbox is."""
    network, profile = parts.networks.of_container(info), _profile_of(parts, info)
    if key in parts.registry or not info.running or network is None or profile is None:
        return False
    parts.registry[key] = _held(parts, key, info, network, profile, greeted=False)
    return True


def _held(
    parts: Parts,
    key: str,
    info: ContainerInfo,
    network: SandboxNetwork,
    profile: SandboxProfile,
    *,
    greeted: bool,
) -> Sandbox:
    """The key's sandbox on a pod that is there already, with a channel to its agent (not yet
    connected)."""
    paths, sid = parts.layout.of(key), sandbox_id(key)
    container = Container(info, parts.containers.link(info, paths), paths, sid)
    return Sandbox(key, sid, container, network, born=born(info), greeted=greeted, profile=profile)


def key_of(info: ContainerInfo, pooled: dict[str, Path]) -> str | None:
    """The (tenant-scoped) key a container of this instance serves: from its labels, or
    for one that began in the warm pool, from the folder it was given; None: not
    adoptable."""
    key = labelled_key(info.labels)  # a pool pod claimed by relabeling has the key's labels
    if key and info.labels.get(LABEL_SANDBOX_ID) == sandbox_id(key):
        return key
    pool_id = info.labels.get(LABEL_POOL, "")
    if not pool_id:
        return None
    folder = pooled.get(pool_id)
    if folder is None or folder.name.startswith(POOL_PREFIX):
        return None  # unassigned (the pool is filled afresh) or its folder is gone
    try:
        key = layout.read_key(folder / "key")
    except OSError:
        return None
    return key if sandbox_id(key) == folder.name else None


async def _adopt(
    parts: Parts, key: str, info: ContainerInfo, image_ids: Mapping[str, str | None]
) -> str:
    """ "adopted", "replaced" (re-created on its profile's image), or "" (not adoptable:
    the caller removes the container)."""
    network = parts.networks.of_container(info)
    if key in parts.registry or not info.running or network is None:
        return ""
    paths = parts.layout.of(key)
    if not _adoptable(parts, paths, info):
        return ""
    profile = parts.profiles.kept(paths.root)
    image_id = image_ids.get(profile.image)
    moved = info.labels.get(LABEL_PROFILE, "") != profile.name
    held = quarantine.kept(paths.root)  # kept as it is, frozen and without its link
    if not held and (moved or (image_id and info.image_id != image_id)):
        await _replace(parts, key, info, network, profile, image_id or "?")
        return "replaced"
    sid = sandbox_id(key)
    container = Container(info, parts.containers.link(info, paths), paths, sid)
    try:
        if not held:
            await parts.networks.attach(key, container, network)
    except SandboxBroken as exc:
        log.warning("not adopting sandbox %r: %s", shown(key), exc)
        await container.agent.close()
        return ""
    sandbox = Sandbox(key, sid, container, network, born=born(info), greeted=False, profile=profile)
    parts.pausing.adopted(sandbox, info)
    parts.registry[key] = sandbox
    return "adopted"


def _adoptable(parts: Parts, paths: layout.Paths, info: ContainerInfo) -> bool:
    """A running container is adopted when its agent's directory is sealed (an agent on a
    unix socket; one reached over the network proves itself by its certificate) and, if its
    workspace should be a file system of its own (or layered), that is mounted (else the
    container was made on the plain directory, and is made again); with
    sandbox.user_namespace on, a container without a user namespace (made before it was
    turned on) is made again."""
    if parts.layout.needs_mount(paths) and not paths.workspace.is_mount():
        return False
    if parts.containers.runtime.userns and not (info.own_userns or parts.daemon_maps):
        log.warning("replacing sandbox %r: it has no user namespace", info.labels[LABEL_KEY])
        return False
    if info.address:
        return True
    return layout.run_dir_is_sealed(paths)


async def _replace(
    parts: Parts,
    key: str,
    info: ContainerInfo,
    network: SandboxNetwork,
    profile: SandboxProfile,
    image_id: str,
) -> None:
    """Re-create, with its workspace, a container that runs another image than its
    profile's (`stockade image build` made a new agent, or the configured image changed), or
    was made with another profile than its key keeps. Done here rather than by the next call
    so that it keeps its network, which EnsureSandbox may have narrowed."""
    log.warning(
        "replacing sandbox %r: its container runs image %s (%s) with profile %r, its profile "
        "%r has image %s (%s); processes running in it are lost, its workspace is kept",
        shown(key), info.image, info.image_id[:12] or "?", info.labels.get(LABEL_PROFILE, ""),
        profile.name, profile.image, image_id[:12],
    )  # fmt: skip
    await asyncio.to_thread(parts.backend.remove, info.id)
    try:
        parts.registry[key] = await parts.create(key, network, profile)
    except SandboxBroken as exc:
        log.warning("sandbox %r not re-created (the next call tries again): %s", shown(key), exc)


async def take_over(
    parts: Parts,
    key: str,
    network: SandboxNetwork | None,
    profile: SandboxProfile | None,
    *,
    replace: bool = True,
) -> Sandbox | None:
    """A host kind whose sandboxes any supervisor of the instance can reach (pods: the
    host kind's `shared`) may find, at a key's first call here, the key's container made by
    another replica: it is taken over when it runs, is the key's, has the network and profile
    asked for (None: any) and its agent answers; otherwise it is removed (a replica holding it
    finds it gone and its next call makes it anew) and None returned for a new one. Called
    under the key's lock, which with shared state (state.url) is every replica's."""
    info = await find(parts, key)
    if info is None or info.labels.get(LABEL_INSTANCE) != parts.containers.instance_id:
        return None
    found, shape = parts.networks.of_container(info), _profile_of(parts, info)
    sid = info.labels.get(LABEL_SANDBOX_ID)
    theirs = labelled_key(info.labels) == key and sid == sandbox_id(key)
    if (
        info.running
        and not info.paused
        and theirs
        and found is not None
        and network in (None, found)
        and shape is not None
        and profile in (None, shape)
    ):
        sandbox = _held(parts, key, info, found, shape, greeted=True)
        try:
            await sandbox.agent.wait_ready(parts.config.sandbox.start_timeout_s)
        except SandboxBroken as exc:
            log.warning("not taking over sandbox %r: %s", shown(key), exc)
            await sandbox.agent.close()
        else:
            log.info("took over sandbox %r (container %s)", shown(key), info.name)
            return sandbox
    if replace:  # a Get only looks
        await asyncio.to_thread(parts.backend.remove, info.id)
    return None


async def held_elsewhere(parts: Parts, key: str) -> Sandbox | None:
    """For a Get at a replica that never served the key: the running pod another replica
    made, held from now on (as its first call here would), nothing removed or made."""
    async with parts.lock(key), parts.quotas.shared_lock(key):
        held = parts.registry.get(key)
        if held is None:
            held = await take_over(parts, key, None, None, replace=False)
            if held is not None:
                parts.registry[key] = held
        return held


async def elsewhere(parts: Parts, key: str) -> bool:
    """A shared host kind's key whose pod another replica made (this one has no folder)."""
    if not parts.host.shared:
        return False
    return await find(parts, key) is not None


async def find(parts: Parts, key: str) -> ContainerInfo | None:
    """The key's container: on a shared host kind, the pod carrying its sandbox-id label
    (one that began in the warm pool keeps its pool name), a running one first; on the host
    kinds, the container of its name."""
    if not parts.host.shared:
        return await asyncio.to_thread(parts.backend.inspect, parts.container_name(key))
    wanted = {**parts.containers.labels(), LABEL_SANDBOX_ID: sandbox_id(key)}
    found = await asyncio.to_thread(parts.backend.list, wanted)
    found.sort(key=lambda i: (not i.running, i.name != parts.container_name(key), i.name))
    return found[0] if found else None


def _profile_of(parts: Parts, info: ContainerInfo) -> SandboxProfile | None:
    """The profile a container was made with (its label; none: the default), None when this
    supervisor has no such profile (configured otherwise than the one that made it)."""
    try:
        return parts.profiles.get(info.labels.get(LABEL_PROFILE, ""))
    except NotFound:
        return None
