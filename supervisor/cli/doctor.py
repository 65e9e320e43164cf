"""`stockade doctor`: is this machine ready to run sandboxes? Each check says how to fix it."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stockade.supervisor.config import Config
from stockade.supervisor.engines import hosts

SETUP = "run `scripts/setup.sh run` (or `make run`)"
KUBE_SETUP = (
    "apply deploy/kubernetes (the namespace, the supervisor's Role, the agent CA Secret) and "
    "set [kubernetes] kubeconfig, or run the supervisor in the cluster"
)
DOCKER_REMAP = (
    'add "userns-remap": "default" to /etc/docker/daemon.json and restart dockerd, '
    "or set sandbox.user_namespace = false"
)


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    warning: bool = False
    """Works, but less safely than it could: printed as WARN with the fix; exit code 0."""


def run_checks(config: Config) -> list[Check]:
    if not hosts.of_engine(config.engine.kind).on_this_machine:  # nothing here runs sandboxes
        return [_kubernetes(config)]
    checks = [_cgroups()]
    if config.engine.kind == "podman":
        checks.append(_podman_runtime())
    engine = _engine(config)
    checks.append(engine)
    if engine.ok:
        checks.append(_runtimes(config))
        checks.append(_image(config))
    if config.sandbox.user_namespace is not False and _userns_possible(config):
        checks.append(_user_namespace(config, engine.ok))
    checks.append(sandbox_ids(config, _userns_possible(config), _host_accounts()))
    checks.append(_tool("debootstrap", "needed by `stockade image build` when no base image"))
    return checks


def _cgroups() -> Check:
    v2 = Path("/sys/fs/cgroup/cgroup.controllers").exists()
    memory = v2 or Path("/sys/fs/cgroup/memory").is_dir()
    pids = v2 or Path("/sys/fs/cgroup/pids").is_dir()
    layout = "v2 (unified)" if v2 else "v1 (hybrid or legacy)"
    ok = memory and pids
    return Check(
        "cgroups",
        ok,
        f"{layout}; memory controller {'present' if memory else 'MISSING'}, "
        f"pids controller {'present' if pids else 'MISSING'}",
        "" if ok else "enable the memory and pids cgroup controllers in the kernel",
    )


def _podman_runtime() -> Check:
    from stockade.supervisor.engines.services import podman_config_problems

    try:
        problems = podman_config_problems()
    except Exception as exc:
        return Check("podman runtime", False, f"cannot read `podman info`: {exc}", SETUP)
    if problems:
        return Check("podman runtime", False, "; ".join(problems), SETUP)
    return Check("podman runtime", True, "runc runtime and ulimits fit this host")


def _engine(config: Config) -> Check:
    from stockade.supervisor.engines.backends import create_backend
    from stockade.supervisor.errors import StockadeError

    url = _engine_url(config)
    if url is None:
        return Check(
            "engine",
            shutil.which("podman") is not None,
            "podman (the supervisor starts `podman system service` itself)",
            SETUP,
        )
    try:
        version = create_backend(config.engine.kind, url).ping()
    except StockadeError as exc:
        return Check("engine", False, str(exc), SETUP)
    return Check("engine", True, f"{config.engine.kind} {version} at {url}")


def _kubernetes(config: Config) -> Check:
    """The API server answers, this namespace's pods may be listed, the agent CA is there."""
    from stockade.supervisor.engines.backends import create_backend
    from stockade.supervisor.engines.backends.base import LABEL_MANAGED
    from stockade.supervisor.errors import StockadeError

    kube = config.kubernetes
    try:
        backend = create_backend("kubernetes", "", kube)
        try:
            version = backend.ping()
            pods = len(backend.list({LABEL_MANAGED: "1"}))
        finally:
            backend.close()
    except StockadeError as exc:
        return Check("kubernetes", False, str(exc), KUBE_SETUP)
    detail = f"API server {version}; namespace {kube.namespace}: {pods} sandbox pod(s), agent CA"
    return Check("kubernetes", True, f"{detail} {kube.ca_secret}")


def _runtimes(config: Config) -> Check:
    """The OCI runtimes the engine knows, and whether the configured one is among them."""
    from stockade.supervisor.engines.backends import create_backend
    from stockade.supervisor.engines.services import configured_runtimes
    from stockade.supervisor.errors import StockadeError

    url = _engine_url(config)
    wanted, podman = config.sandbox.runtime, config.engine.kind == "podman"
    try:
        backend = create_backend(config.engine.kind, url) if url else None
        known = backend.runtimes() if backend else configured_runtimes()
        default = backend.runtime_facts().name if backend else ""
    except StockadeError as exc:
        return Check("runtimes", False, f"cannot ask the engine: {exc}", SETUP)
    listed = ", ".join(
        f"{name}{' (default)' if name == default else ''}{f' {path}' if path else ''}"
        for name, path in sorted(known.items())
    )
    detail = f"known: {listed or 'none'}; sandbox.runtime: {wanted or '(the default)'}"
    if podman and wanted and config.engine.socket and wanted != default:
        fix = f"start that service as `podman --runtime {wanted} system service`"
        why = f"the Podman service at {url} runs its containers under {default or '?'}"
        return Check("runtimes", False, f"{detail}: {why}", fix)
    if not wanted or wanted in known:
        return Check("runtimes", True, detail)
    if podman and wanted.startswith("/"):
        ok = os.access(wanted, os.X_OK)
        return Check("runtimes", ok, detail, "" if ok else f"{wanted} is not an executable")
    fix = (
        "give an absolute path, or list the name under [engine.runtimes] in containers.conf"
        if podman
        else 'register it under "runtimes" in /etc/docker/daemon.json and reload dockerd'
    )
    return Check("runtimes", False, f"{detail}: not known to the engine", fix)


def _engine_url(config: Config) -> str | None:
    from stockade.supervisor.app import DOCKER_SOCKET
    from stockade.supervisor.engines.services import ping

    if config.engine.socket:
        return config.engine.socket
    if config.engine.kind == "docker":
        return DOCKER_SOCKET
    for candidate in (config.state_dir / "podman.sock", Path("/run/podman/podman.sock")):
        if ping(candidate):
            return f"unix://{candidate}"
    return None


def _userns_possible(config: Config) -> bool:
    """Whether sandboxes get user namespaces: configured on, or left unset where start()
    turns them on (Podman on this host, not gVisor, with a `containers` range)."""
    from stockade.supervisor.engines.userns import auto_refusal

    if config.sandbox.user_namespace is not None:
        return config.sandbox.user_namespace
    gvisor = "runsc" in config.sandbox.runtime
    return auto_refusal(config.engine.kind, gvisor, host_mounts=True) is None


def _host_accounts() -> dict[int, str]:
    """uid -> name of this host's accounts (/etc/passwd, and NSS where it answers)."""
    import pwd

    try:
        return {entry.pw_uid: entry.pw_name for entry in pwd.getpwall()}
    except OSError:
        return {}


def sandbox_ids(config: Config, namespaced: bool, accounts: dict[int, str]) -> Check:
    """Whose ids do sandboxes run as on the host? With a user namespace, ids of no host user,
    a range per sandbox on Podman; without one, the configured sandbox user and the agent's
    user themselves: a host account's uid would make the sandbox that person (its files, its
    processes), and every sandbox shares them."""
    from stockade.supervisor.config import AGENT_UID

    uid = int(config.sandbox.user.partition(":")[0])
    name = "sandbox ids"
    if namespaced and config.engine.kind == "podman":
        return Check(name, True, "a range of 65536 ids per sandbox (Podman's --userns=auto)")
    taken = [f"{i} is the host account {accounts[i]!r}" for i in (uid, AGENT_UID) if i in accounts]
    if taken:
        fix = "set sandbox.user to a uid:gid of no host account (the default 65532:65532)"
        if AGENT_UID in accounts:
            fix = f"remove or renumber the host account using {AGENT_UID}, the agent's uid"
        return Check(name, False, "; ".join(taken), fix)
    fix = "Podman gives each sandbox a range of ids of its own (sandbox.user_namespace)"
    if namespaced:
        detail = (
            "Docker's userns-remap: ids of no host user, but one range for every container "
            f"of the daemon: sandboxes share uid {uid} of it with each other"
        )
    else:
        detail = (
            f"no user namespace: every sandbox runs as host uid {uid} (no host account's), "
            f"the agent as {AGENT_UID}; sandboxes share that uid with each other"
        )
        fix += '; on Docker, add "userns-remap": "default" to /etc/docker/daemon.json'
    return Check(name, True, detail, fix, warning=True)


def _user_namespace(config: Config, engine_ok: bool) -> Check:
    """Podman's ranges come from this host's /etc/subuid; Docker's remap is the daemon's."""
    from stockade.supervisor.engines.userns import (
        SUBGID,
        SUBUID,
        check_podman_subids,
        read_host_file,
    )
    from stockade.supervisor.errors import StockadeError

    try:
        if config.engine.kind == "podman":
            check_podman_subids(read_host_file(SUBUID), read_host_file(SUBGID))
            return Check("user namespaces", True, "Podman's 'containers' range in /etc/subuid")
        url = _engine_url(config)
        if not engine_ok or url is None:
            return Check("user namespaces", False, "the engine does not answer", SETUP)
        from stockade.supervisor.engines.backends import create_backend

        maps = create_backend(config.engine.kind, url).check_user_namespace(True)
    except StockadeError as exc:
        fix = SETUP if config.engine.kind == "podman" else DOCKER_REMAP
        return Check("user namespaces", False, str(exc), fix)
    first = maps.uids[0] if maps and maps.uids else None
    where = f" to host ids from {first.host}" if first else ""
    return Check("user namespaces", True, f"Docker remaps (userns-remap){where}")


def _image(config: Config) -> Check:
    import subprocess

    from stockade.supervisor.app import sandbox_image

    ref = sandbox_image(config)
    kind = config.engine.kind
    found = (
        subprocess.run([kind, "image", "inspect", ref], capture_output=True, timeout=60).returncode
        == 0
    )
    fix = f"stockade image build --engine {kind}"
    return Check("sandbox image", found, ref if found else f"{ref} is missing", fix)


def _tool(name: str, why: str) -> Check:
    path = shutil.which(name)
    return Check(
        name, path is not None, path or f"not installed ({why})", f"apt-get install {name}"
    )


def isolation_lines(report: dict[str, Any]) -> list[str]:
    """`stockade doctor --sandbox KEY`: the isolation report, one aspect per line."""
    inside, outside, runtime = report["inside"], report["outside"], report["runtime"]
    ident, caps, seccomp, root = (
        inside["identity"], inside["capabilities"], inside["seccomp"], inside["root"]
    )  # fmt: skip
    groups = ",".join(str(g) for g in ident["groups"]) or "none"
    cap_text = "; ".join(
        f"{kind} {' '.join(caps[kind]['names']) or 'none'}"
        for kind in ("effective", "permitted", "inheritable", "bounding", "ambient")
    )
    filters = "" if seccomp["filters"] < 0 else f", {seccomp['filters']} filter(s)"
    ns = report["namespaces"]
    private = " ".join(n["type"] for n in ns if n["private"]) or "none"
    shared = " ".join(n["type"] for n in ns if not n["private"]) or "none"
    lines = [
        f"sandbox {report['key']} on {report['engine']}, container {report['container_id'][:12]}",
        "inside:",
        f"  identity      uid {ident['uid']} (euid {ident['euid']}), gid {ident['gid']} "
        f"(egid {ident['egid']}), groups {groups}",
        f"  capabilities  {cap_text}",
        f"  no_new_privs  {_yes(inside['no_new_privs'])}",
        f"  seccomp       {seccomp['mode_name']}{filters}",
        f"  root          {'read-only' if root['read_only'] else 'WRITABLE'} (mount "
        f"{'ro' if root['mount_read_only'] else 'rw'}; creating a file: "
        f"{root['write_error'] or 'succeeded'})",
        f"  cgroup        {_cgroup(inside['cgroup'])}",
        f"  namespaces    private: {private}; shared with the host: {shared}",
        f"  user ns       {_userns(inside)}",
        *_network(inside),
        "  mounts:",
        *(
            f"    {m['target']} {m['fs_type']} {','.join(m['options'])}"
            for m in inside["mounts"]
        ),
        *(f"  problem: {p}" for p in inside["problems"]),
        "outside (engine):",
        *_outside(outside),
        f"runtime: {runtime['name'] or '?'} {runtime['version'] or '(version unknown)'}"
        + (f", package {runtime['package_version']} ({runtime['package_source']})"
           if runtime["package_version"] else "")
        + (f", {runtime['path']}" if runtime["path"] else ""),
        *(f"  {c['id']:<15} {c['verdict']:<14} {c['reason']}" for c in runtime["cves"]),
    ]  # fmt: skip
    return lines


def isolation_ok(report: dict[str, Any]) -> bool:
    """False when the engine runs the sandbox privileged or the runtime is vulnerable."""
    vulnerable = any(c["verdict"] == "VULNERABLE" for c in report["runtime"]["cves"])
    return not vulnerable and not report["outside"]["privileged"]


def _yes(value: bool) -> str:
    return "yes" if value else "NO"


def _size(value: int) -> str:
    return f"{value / (1 << 20):.0f} MiB" if value >= 1 << 20 else f"{value} B"


def _limit(limit: dict[str, Any], size: bool = False) -> str:
    if not limit["source"]:
        return "?"
    if limit["unlimited"]:
        return "unlimited"
    return _size(limit["value"]) if size else str(limit["value"])


def _map(ranges: list[dict[str, Any]]) -> str:
    return ",".join(f"{r['inside']}:{r['host']}:{r['count']}" for r in ranges) or "?"


def _userns(inside: dict[str, Any]) -> str:
    maps = f"uid map {_map(inside['uid_map'])}; gid map {_map(inside['gid_map'])}"
    if inside["user_namespace"]:
        return f"yes: {maps} (inside:host:count)"
    return f"NO: the sandbox's ids are the host's ({maps})"


def _cgroup(cg: dict[str, Any]) -> str:
    if not cg["version"]:
        return "no limit files readable"
    cpus = f"{cg['cpus']:.2f}" if cg["cpus"] else "unlimited"
    swap = "memory+swap" if cg["version"] == "v1" else "swap"
    return (
        f"{cg['version']}: memory {_limit(cg['memory_bytes'], True)}, {swap} "
        f"{_limit(cg['swap_bytes'], True)}, pids {_limit(cg['pids'])}, cpus {cpus}"
    )


def _network(inside: dict[str, Any]) -> list[str]:
    names = [
        f"{i['name']}" + (f" ({' '.join(i['ipv6'])})" if i["ipv6"] else "")
        for i in inside["interfaces"]
    ]
    routes = [
        f"    {r['family']} {r['destination']} dev {r['interface']}"
        + (f" via {r['gateway']}" if r["gateway"] else "")
        + f" metric {r['metric']} {r['flags']}"
        for r in inside["routes"]
    ]
    return [
        f"  interfaces    {', '.join(names) or 'none'}",
        f"  ipv4 local    {' '.join(inside['local_ipv4']) or 'none'}",
        f"  routes        {len(routes) or 'none'}",
        *routes,
    ]


def _outside(o: dict[str, Any]) -> list[str]:
    cpus = o["nano_cpus"] / 1e9 if o["nano_cpus"] else 0
    if not cpus and o["cpu_quota_us"] > 0 and o["cpu_period_us"]:
        cpus = o["cpu_quota_us"] / o["cpu_period_us"]
    return [
        f"  runtime {o['runtime'] or '?'}, privileged {'YES' if o['privileged'] else 'no'}, "
        f"user {o['user'] or '(image default)'}, read-only root {_yes(o['read_only_root'])}",
        f"  cap_drop {' '.join(o['cap_drop']) or 'none'}; "
        f"cap_add {' '.join(o['cap_add']) or 'none'}",
        f"  no-new-privileges {_yes(o['no_new_privileges'])}, seccomp {o['seccomp_profile']}",
        f"  security options {' '.join(o['security_options']) or 'none'}",
        f"  network {o['network_mode'] or '?'}, userns {o['userns_mode'] or 'host'}, "
        f"cgroupns {o['cgroupns_mode'] or '-'}, host pid {o['host_pid']}",
        *(
            [f"  id maps uid {_map(o['uid_map'])}; gid {_map(o['gid_map'])}"]
            if o["uid_map"] or o["gid_map"]
            else []
        ),
        f"  memory {_size(o['memory_bytes'])} (with swap {_size(o['memory_swap_bytes'])}), "
        f"cpus {cpus:.2f}, pids {o['pids_limit']}",
    ]
