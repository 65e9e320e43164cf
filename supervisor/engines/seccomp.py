"""The seccomp profile of every sandbox: the engine's default, with namespace creation shut.

Podman's default profile allows clone, clone3 and unshare with any flags, so a sandbox could
make a user namespace and hold every capability inside it: a way into kernel attack surface
(mounts, netfilter, ...) that a container without capabilities otherwise keeps closed.
Docker's built-in profile already refuses namespace flags to processes without CAP_SYS_ADMIN;
this module gives both engines the same rule, on top of the containers-common default that
Podman installs:

- clone and unshare are allowed only without namespace flags (as Docker does);
- clone3 gets ENOSYS (its flags sit in memory seccomp cannot read; libc falls back to clone).

Under gVisor (runsc with --oci-seccomp) the profile is applied by gVisor's own kernel, which
in runsc 20221219 ignores errnoRet: a refused call gets EPERM, on which glibc does not fall
back from clone3 to clone, so no thread could start. There clone3 is allowed: that gVisor has
no clone3 and answers ENOSYS itself (a later one would make its namespaces in its own kernel,
not the host's).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Final

log = logging.getLogger("stockade.seccomp")

BASE_PROFILES: Final = (
    Path("/usr/share/containers/seccomp.json"),
    Path("/etc/containers/seccomp.json"),
)
NAMESPACE_FLAGS: Final = 0x7E020000
"""CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET."""
ENOSYS: Final = 38
_GUARDED: Final = frozenset({"clone", "clone3", "unshare"})


def tighten(profile: dict[str, Any], *, gvisor: bool = False) -> dict[str, Any]:
    """`profile` with clone, clone3 and unshare replaced by the rules above."""
    rules = []
    for rule in profile.get("syscalls", []):
        names = [n for n in rule.get("names", []) if n not in _GUARDED]
        if names:
            rules.append({**rule, "names": names})
    no_namespaces = [
        {"index": 0, "value": NAMESPACE_FLAGS, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}
    ]
    rules += [
        {"names": ["clone", "unshare"], "action": "SCMP_ACT_ALLOW", "args": no_namespaces},
        {"names": ["clone3"], "action": "SCMP_ACT_ALLOW"}
        if gvisor
        else {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": ENOSYS},
    ]
    return {**profile, "syscalls": rules}


def write_profile(
    target: Path, bases: tuple[Path, ...] = BASE_PROFILES, *, gvisor: bool = False
) -> Path | None:
    """Write the tightened profile to `target` (for gVisor: see above); None (the engine's
    default stays) when no base profile is installed."""
    for base in bases:
        try:
            profile = json.loads(base.read_text())
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as exc:
            log.warning("cannot read the seccomp profile %s: %s", base, exc)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(tighten(profile, gvisor=gvisor)))
        return target
    log.warning(
        "no containers-common seccomp profile (%s): sandboxes run with the engine's default "
        "profile (Docker's refuses new namespaces; Podman's does not)",
        ", ".join(map(str, bases)),
    )
    return None
