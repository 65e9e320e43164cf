"""The Pod Security Standards' "restricted" profile (baseline's rules included), as checks of a
pod spec given as a dict: what the API server's Pod Security admission would refuse in a
namespace labelled pod-security.kubernetes.io/enforce=restricted.

No cluster runs here, so the tests hold manifests to these rules instead; the table follows
https://kubernetes.io/docs/concepts/security/pod-security-standards/ (v1.30 and later).
Usable for any pod spec: the supervisor Deployment's template, a sandbox pod.
"""

from __future__ import annotations

from typing import Any

RESTRICTED_VOLUME_TYPES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t"})
APPARMOR_TYPES = frozenset({"RuntimeDefault", "Localhost"})
SECCOMP_TYPES = frozenset({"RuntimeDefault", "Localhost"})


def restricted_violations(pod_spec: dict[str, Any]) -> list[str]:
    """Every rule of the restricted profile that pod_spec breaks, one line each; [] when none."""
    found: list[str] = []
    pod_ctx = pod_spec.get("securityContext") or {}
    containers = [
        *pod_spec.get("initContainers", []),
        *pod_spec.get("containers", []),
        *pod_spec.get("ephemeralContainers", []),
    ]
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod_spec.get(field):
            found.append(f"spec.{field} is true")
    for volume in pod_spec.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUME_TYPES:
            found.append(f"volume {volume.get('name')!r} is of type {sorted(kinds)}")
    for sysctl in pod_ctx.get("sysctls", []):
        if sysctl.get("name") not in SAFE_SYSCTLS:
            found.append(f"sysctl {sysctl.get('name')!r} is not a safe one")
    found += _context_violations("pod", pod_ctx)
    for container in containers:
        name = f"container {container.get('name')!r}"
        ctx = container.get("securityContext") or {}
        found += _context_violations(name, ctx)
        found += _container_violations(name, ctx, pod_ctx)
        for port in container.get("ports", []):
            if port.get("hostPort"):
                found.append(f"{name} uses hostPort {port['hostPort']}")
    return found


def _context_violations(where: str, ctx: dict[str, Any]) -> list[str]:
    """The rules that apply alike to the pod's and to each container's securityContext."""
    found = []
    if (ctx.get("windowsOptions") or {}).get("hostProcess"):
        found.append(f"{where}: windowsOptions.hostProcess is true")
    if ctx.get("runAsUser") == 0:
        found.append(f"{where}: runAsUser is 0")
    if ctx.get("runAsNonRoot") is False:
        found.append(f"{where}: runAsNonRoot is false")
    seccomp = (ctx.get("seccompProfile") or {}).get("type")
    if seccomp is not None and seccomp not in SECCOMP_TYPES:
        found.append(f"{where}: seccompProfile is {seccomp}")
    apparmor = (ctx.get("appArmorProfile") or {}).get("type")
    if apparmor is not None and apparmor not in APPARMOR_TYPES:
        found.append(f"{where}: appArmorProfile is {apparmor}")
    selinux = ctx.get("seLinuxOptions") or {}
    if selinux.get("type", "") not in SELINUX_TYPES or selinux.get("user") or selinux.get("role"):
        found.append(f"{where}: seLinuxOptions {selinux} are not allowed")
    return found


def _container_violations(name: str, ctx: dict[str, Any], pod_ctx: dict[str, Any]) -> list[str]:
    found = []
    if ctx.get("privileged"):
        found.append(f"{name} is privileged")
    if ctx.get("allowPrivilegeEscalation") is not False:
        found.append(f"{name}: allowPrivilegeEscalation is not false")
    if ctx.get("procMount", "Default") != "Default":
        found.append(f"{name}: procMount is {ctx['procMount']}")
    capabilities = ctx.get("capabilities") or {}
    if "ALL" not in capabilities.get("drop", []):
        found.append(f"{name} does not drop ALL capabilities")
    added = set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}
    if added:
        found.append(f"{name} adds capabilities {sorted(added)}")
    if not (ctx.get("runAsNonRoot") or pod_ctx.get("runAsNonRoot")):
        found.append(f"{name}: runAsNonRoot is not true (in the pod or the container)")
    seccomp = (ctx.get("seccompProfile") or pod_ctx.get("seccompProfile") or {}).get("type")
    if seccomp not in SECCOMP_TYPES:
        found.append(f"{name}: no RuntimeDefault or Localhost seccompProfile")
    return found
