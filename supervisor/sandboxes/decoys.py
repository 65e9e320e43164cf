"""Planting a sandbox's decoys (policy/honeytokens.py) where an attacker looks for
credentials: ~/.aws/credentials, ~/.config/gh/hosts.yml, ~/.netrc, `.env` at the workspace
root (only with [honeytokens] workspace_env), the paths the operator names, and a variable of
the container's environment.

The files are written by the sandbox's own agent, as the sandbox user (an `exec` of a short
script: umask 077, so files 0600 and folders 0700), once per container: when it is made, made
again (a heal, a new network or profile) or adopted after a restart (HOME is a tmpfs: a new
container has none of them). A file that exists is never replaced: it is either ours from
before or the user's own. The variable goes in the container's environment when it is made
(a warm-pool container cannot have it: such a sandbox is never taken from the pool)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from stockade.supervisor.config import Config
from stockade.supervisor.config.honey import check_path
from stockade.supervisor.keys import shown, split
from stockade.supervisor.policy.honeytokens import Decoys, Honeytokens
from stockade.supervisor.sandboxes.profiles import SandboxProfile
from stockade.supervisor.sandboxes.sandbox import Sandbox

log = logging.getLogger("stockade")

PLANT_TIMEOUT_S = 30.0
HOME_FILES = {
    "aws": "~/.aws/credentials",
    "github": "~/.config/gh/hosts.yml",
    "netrc": "~/.netrc",
}
SCRIPT = r"""umask 077
i=0
while [ "$i" -lt "$STK_N" ]; do
  eval "p=\${STK_P$i}; c=\${STK_C$i}"
  case $p in "~/"*) p="$HOME/${p#"~/"}" ;; esac
  if [ -e "$p" ] || [ -L "$p" ]; then
    echo "kept $i"
  elif mkdir -p -- "$(dirname -- "$p")" 2>/dev/null && (set -C; printf '%s' "$c" >"$p") 2>/dev/null
  then
    echo "planted $i"
  else
    echo "failed $i"
  fi
  i=$((i + 1))
done
"""
"""Run by /bin/sh as the sandbox user; paths and contents come in the environment (STK_Pn,
STK_Cn), never in the command line. `set -C` creates each file exclusively."""


class Planter:
    def __init__(self, config: Config, honeytokens: Honeytokens | None) -> None:
        self._config = config.honeytokens
        self._honey = honeytokens if config.honeytokens.enabled else None

    def decoys_of(self, key: str, profile: SandboxProfile | None) -> Decoys | None:
        """The key's decoys when [honeytokens] applies to it (its tenant and profile)."""
        if self._honey is None:
            return None
        tenant, _ = split(key)
        if not self._config.applies(tenant, profile.name if profile is not None else ""):
            return None
        return self._honey.decoys(key)

    async def know(self, held: Iterable[tuple[str, SandboxProfile]]) -> None:
        """Arm the tripwire with the decoys of sandboxes made before this start (their
        folders), before any of them is called: another sandbox may use one first."""
        for key, profile in held:
            self.decoys_of(key, profile)
        if self._honey is not None:
            await self._honey.settle()

    def environment(self, key: str, profile: SandboxProfile | None) -> dict[str, str]:
        """The decoy variable for the container of `key` (none when not planted there)."""
        if "env" not in self._config.kinds:
            return {}
        decoys = self.decoys_of(key, profile)
        return {} if decoys is None else {self._config.env_var: decoys.env}

    def poolable(self, key: str, profile: SandboxProfile, *pooled: SandboxProfile) -> bool:
        """Whether the key's container may come from the warm pool: made with a profile the
        pool keeps (`pooled`), and without a decoy variable (a pooled container was made
        without one)."""
        return profile in pooled and not self.environment(key, profile)

    def files(self, decoys: Decoys) -> list[tuple[str, str]]:
        """(path, content) of every file to plant: `~/...`, absolute or workspace-relative."""
        contents = {"aws": decoys.aws_file(), "github": decoys.gh_file()}
        contents["netrc"] = decoys.netrc_file()
        kinds = self._config.kinds
        chosen = [(path, contents[kind]) for kind, path in HOME_FILES.items() if kind in kinds]
        extra = [".env"] if self._config.workspace_env else []
        extra += [p for p in map(check_path, self._config.paths) if p not in extra]
        return chosen + [(path, decoys.dotenv_file()) for path in extra]

    async def plant(self, sandbox: Sandbox) -> None:
        """Plant the sandbox's decoy files, once per container. Never raises: a sandbox whose
        decoys could not be planted still serves (logged), and is tried again on its next
        container."""
        if sandbox.decoys_planted:
            return
        decoys = self.decoys_of(sandbox.key, sandbox.profile)
        if decoys is not None and self._honey is not None:
            await self._honey.settle()  # compiled into the tripwire off the event loop
        files = self.files(decoys) if decoys is not None else []
        if not files:
            sandbox.decoys_planted = True
            return
        env = {"STK_N": str(len(files))}
        for i, (path, content) in enumerate(files):
            env[f"STK_P{i}"], env[f"STK_C{i}"] = path, content
        args: dict[str, Any] = {"command": SCRIPT, "env": env, "timeout": PLANT_TIMEOUT_S}
        try:
            reply = await sandbox.agent.invoke(
                "exec", args, PLANT_TIMEOUT_S + 5, "plant-decoys-" + sandbox.sid
            )
        except Exception as exc:  # a sandbox that cannot take it will be healed by its call
            log.warning("sandbox %r: decoys not planted: %s", shown(sandbox.key), exc)
            return
        result = reply.result or {}
        if reply.error_code or result.get("exit_code") != 0:
            why = reply.error_message or str(result.get("stderr", ""))[:200]
            log.warning("sandbox %r: decoys not planted: %s", shown(sandbox.key), why)
            return
        sandbox.decoys_planted = True
        failed = [
            files[int(line.split()[1])][0]
            for line in str(result.get("stdout", "")).splitlines()
            if line.startswith("failed ")
            and line.split()[1].isdigit()
            and int(line.split()[1]) < len(files)
        ]
        if failed:
            log.warning(
                "sandbox %r: decoys not planted at %s (not writable by the sandbox user)",
                shown(sandbox.key),
                ", ".join(failed),
            )
