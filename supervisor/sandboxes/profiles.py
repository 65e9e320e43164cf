"""Sandbox profiles: the image, CPUs and memory a sandbox's container is made with. The
default profile ("", shown as `base`) is [sandbox]'s; [profiles.NAME] name others. A key's
profile is chosen when its container is made (EnsureSandbox `profile`, an E2B templateID)
and kept in its folder (`profile`), as its network is (network.py): a container re-created
after a heal, a prune, a maximum age or a restart gets it again."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from stockade.supervisor.config import Config
from stockade.supervisor.errors import NotFound

log = logging.getLogger("stockade")

KEPT = "profile"
"""The file in a key's folder that names the profile chosen for it."""
BASE = "base"
"""What the default profile is called where a name must be shown (E2B's default template)."""


@dataclass(frozen=True)
class SandboxShell:
    """The shell a sandbox's commands run in ([sandbox] shell and login_shell, a tenant's,
    a profile's): carried to the agent in exec's and process start's arguments."""

    name: str = "bash"
    login: bool = False

    def arguments(self) -> dict[str, object]:
        return {"shell": self.name, "login": True} if self.login else {"shell": self.name}


def shell_of(config: Config, profile: str, tenant: str) -> SandboxShell:
    """The shell of a sandbox of that profile and tenant: the profile's choice, else the
    tenant's, else [sandbox]'s; login applies to bash only."""
    chosen = config.profiles.get(profile)
    limits = config.tenant_limits(tenant)
    name = (chosen.shell if chosen else "") or limits.shell or config.sandbox.shell
    logins = (chosen.login_shell if chosen else None, limits.login_shell)
    login = next((x for x in logins if x is not None), config.sandbox.login_shell)
    return SandboxShell(name, login and name == "bash")


@dataclass(frozen=True)
class SandboxProfile:
    name: str
    """"" for the default ([sandbox])."""
    image: str
    cpus: float
    memory_mb: int

    @property
    def shown(self) -> str:
        return self.name or BASE


class Profiles:
    def __init__(self, config: Config, image: str) -> None:
        sb = config.sandbox
        self.default = SandboxProfile("", image, sb.cpus, sb.memory_mb)
        self._named = {
            name: SandboxProfile(
                name, p.image or image, p.cpus or sb.cpus, p.memory_mb or sb.memory_mb
            )
            for name, p in config.profiles.items()
        }
        self.descriptions = {name: p.description for name, p in config.profiles.items()}

    @property
    def names(self) -> list[str]:
        return [BASE, *sorted(self._named)]

    @property
    def images(self) -> set[str]:
        return {self.default.image, *(p.image for p in self._named.values())}

    def get(self, name: str) -> SandboxProfile:
        """The profile of that name ("" or "base": the default); NotFound naming the others."""
        if name in ("", BASE):
            return self.default
        found = self._named.get(name)
        if found is None:
            raise NotFound(
                f"no sandbox profile {name[:64]!r}: this Stockade has {', '.join(self.names)} "
                "([profiles.NAME] in its config)"
            )
        return found

    def remember(self, folder: Path, profile: SandboxProfile) -> None:
        path = folder / KEPT
        if profile.name:
            path.write_text(profile.name + "\n")
        else:
            path.unlink(missing_ok=True)

    def kept(self, folder: Path) -> SandboxProfile:
        """The key's profile: the one chosen for it, or the default (also when the chosen
        one is no longer configured: said in the log)."""
        try:
            name = (folder / KEPT).read_text().strip()
        except FileNotFoundError:
            return self.default
        except OSError as exc:
            log.warning("the profile kept in %s is unreadable (%s): the default", folder, exc)
            return self.default
        try:
            return self.get(name)
        except NotFound:
            log.warning(
                "sandbox profile %r of %s is no longer configured: the default", name, folder
            )
            return self.default
