"""The built-in rules: the one list of what the default guard blocks, and why.

``RULES`` names each rule, its category, what it does when it matches, what it blocks and
why, and the checks (``checks``) that find it in one invocation or one simple command. Rules
with no check here are found by the evaluation, which looks across commands: code fed to a
shell (``remote-code-exec``, ``decode-to-shell``, ``netcat-shell``), inline code
(``script-reverse-shell``, ``fork-bomb``), run-time program names (``dynamic-command``) and
what could not be parsed (``parse-error``, ``too-complex``). ``rules_markdown()`` renders the
table; docs/policy-guard-rules.md is its output (a unit test keeps the two the same):
``python -m stockade.supervisor.policy.guard > docs/policy-guard-rules.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from stockade.supervisor.policy.guard import checks
from stockade.supervisor.policy.guard.invocations import Inv
from stockade.supervisor.policy.guard.parsing import (
    MAX_BYTES,
    MAX_NESTING,
    MAX_NODES,
    MAX_PIPES,
    PARSE_SECONDS,
    Command,
)

InvocationCheck = Callable[[Inv], str | None]
CommandCheck = Callable[[Command], str | None]

_DENY = "deny"
_UNCHECKABLE = "`guard.on_parse_error`: deny (default) or ask"


@dataclass(frozen=True)
class Rule:
    """One built-in rule. ``blocks`` and ``why`` are Markdown."""

    name: str
    category: str
    action: str
    blocks: str
    why: str
    on_invocation: InvocationCheck | None = None
    on_command: CommandCheck | None = None


RULES = (
    Rule(
        "privilege-escalation",
        "privilege-escalation",
        _DENY,
        "`sudo`, `su`, `doas`, `pkexec`, `runuser`, `sudoedit`",
        "not the agent's to do",
        checks.privilege,
    ),
    Rule(
        "destructive-rm",
        "destructive-file-ops",
        _DENY,
        "Recursive `rm` (any spelling of `-r`), `rsync --delete` or inline `rmtree(..)` of "
        "anything but a path below the workspace root, `$HOME` or /tmp: the workspace root and "
        "the folders above it (`.`, `/workspace`, `build/../..`, `$PWD`), a glob that can match "
        "everything at one of those roots (`*`, `.*`, `./*`, `/workspace/*`; `*.egg-info` "
        "passes), `/`, `~`, /tmp itself, system folders, a path known only at run time "
        '(`"$DIR"`, `$(cmd)`, `~user`, a relative path after `cd "$X"`, what `xargs` reads); '
        "`--no-preserve-root`. Routine cleanup (`rm -rf build dist node_modules`) passes: the "
        "workspace is the agent's",
        "the workspace and the system are what matter; a value the guard cannot see could be `/`",
        checks.rm,
    ),
    Rule(
        "destructive-find",
        "destructive-file-ops",
        _DENY,
        "`find -delete` in the same places; at a root itself only with a name or path test "
        "nothing undoes (`find . -name '*.pyc' -delete` passes, `find . -delete` and "
        "`find . ! -name x -delete` do not)",
        "as for `destructive-rm`",
        checks.find,
    ),
    Rule(
        "windows-del",
        "destructive-file-ops",
        _DENY,
        "`del /f`, `del /s` (also `erase`)",
        "file destruction",
        checks.windows_del,
    ),
    Rule(
        "windows-rmdir",
        "destructive-file-ops",
        _DENY,
        "`rmdir /s`, `rd /s`",
        "file destruction",
        checks.windows_rmdir,
    ),
    Rule(
        "windows-format",
        "disk-destruction",
        _DENY,
        "`format c:`",
        "disk destruction",
        checks.windows_format,
    ),
    Rule(
        "mkfs",
        "disk-destruction",
        _DENY,
        "`mkfs`, `mkfs.*`, `mke2fs`, `mkswap`, `wipefs` on anything but files below the "
        "workspace: a device, a path outside the workspace or known only at run time (every "
        "word but an option must name a file below the workspace: `mkfs.erofs image.erofs "
        "root/` passes, `mkfs.ext4 /dev/sda1` does not)",
        "disk destruction",
        checks.mkfs,
    ),
    Rule(
        "raw-disk-write",
        "disk-destruction",
        _DENY,
        "A redirect, `of=`, `tee`/`cp`/`shred`/`fdisk`/`mksquashfs`/... onto `/dev/sd*`, "
        "`/dev/nvme*`, `/dev/vd*`, `/dev/hd*`, `/dev/xvd*`, `/dev/mmcblk*` ...",
        "disk destruction",
        checks.disk_write,
        checks.disk_redirect,
    ),
    Rule(
        "dd-copy",
        "disk-destruction",
        _DENY,
        "`dd` reading a device or kernel memory (`if=/dev/sda`, `/dev/mem`, `/proc/kcore`; "
        "/dev/zero and /dev/urandom pass), writing a device or anywhere but below the "
        "workspace, `$HOME` and /tmp, or a run-time path; `dd` between ordinary files passes",
        "reading a disk is exfiltration, writing one (or a system file) destruction",
        checks.dd,
    ),
    Rule(
        "system-power",
        "system-control",
        _DENY,
        "`shutdown`, `reboot`, `poweroff`, `halt`, `init 0`/`6`, `kexec -e`, "
        "`systemctl`/`loginctl` `poweroff`/`reboot`/`halt`/`kexec`/`suspend` ..., "
        "a write to /proc/sysrq-trigger",
        "not the agent's to do",
        checks.power,
        checks.sysrq,
    ),
    Rule(
        "kill-all",
        "system-control",
        _DENY,
        "`kill -9 -1`, `kill 1` (init), `killall5`",
        "not the agent's to do",
        checks.kill,
    ),
    Rule(
        "chmod-root",
        "permissions",
        _DENY,
        "`chmod`/`chown`/`chgrp` on `/`, `~` or a system or home directory, or on anything "
        "under /etc, /boot, /root, /proc, /sys, /dev, /bin, /usr/bin ...; `chmod` setting the "
        "setuid/setgid bit",
        "privilege and system damage",
        checks.chmod_root,
    ),
    Rule(
        "dev-tcp",
        "reverse-shell",
        _DENY,
        "`/dev/tcp/` or `/dev/udp/` anywhere (words, redirects, inline code)",
        "known attack shape",
        None,
        checks.dev_net,
    ),
    Rule(
        "netcat-shell",
        "reverse-shell",
        _DENY,
        "`nc`/`ncat` `-e`/`-c`/`--exec`/`--sh-exec`, a shell and netcat/socat/telnet in one "
        "pipeline, or network data run as code",
        "known attack shape",
        checks.netcat,
    ),
    Rule(
        "socat-exec",
        "reverse-shell",
        _DENY,
        "`socat` with an `exec:`/`system:` address",
        "known attack shape",
        checks.socat,
    ),
    Rule(
        "script-reverse-shell",
        "reverse-shell",
        _DENY,
        "python/perl/ruby/php/node inline code with a socket, a connect and a process spawn",
        "known attack shape",
    ),
    Rule(
        "remote-code-exec",
        "remote-code-exec",
        _DENY,
        'Downloader output run as code (`curl | sh`, `sh <(curl ..)`, `bash -c "$(curl ..)"`), '
        "or a downloaded file run later in the same command",
        "code nobody has read",
    ),
    Rule(
        "decode-to-shell",
        "eval-injection",
        _DENY,
        "Decoder output run as code (`base64 -d | sh`, `xxd -r | bash`), or a decoded file run "
        "later in the same command",
        "code nobody has read",
    ),
    Rule(
        "eval-substitution",
        "eval-injection",
        _DENY,
        "`eval` of a command substitution (`eval $(..)`), but for the shell set-up idioms of "
        '`idioms.SETUP_IDIOMS` (`eval "$(pyenv init -)"`, `eval "$(ssh-agent -s)"` ...)',
        "code nobody has read",
        checks.eval_sub,
    ),
    Rule(
        "fork-bomb",
        "fork-bomb",
        _DENY,
        "A function that calls itself in the background or in a pipeline (`:(){ :|:& };:`), an "
        "endless loop that starts background processes, `fork` in a loop in inline code",
        "resource abuse",
    ),
    Rule(
        "crypto-miner",
        "abuse",
        _DENY,
        "Known miners (`xmrig`, `minerd`, ...), `stratum+tcp://` pools",
        "resource abuse",
        checks.miner,
    ),
    Rule(
        "dynamic-command",
        "dynamic",
        "ask; deny",
        "The program name is known only at run time (`$CMD`, `$(..)`, a glob): asks; denies "
        "when its arguments would be destructive for `rm`, `find`, `dd`, `chmod`, `chown`, `nc` "
        "or `socat`",
        "the guard cannot see the program",
    ),
    Rule(
        "parse-error",
        "unchecked",
        _UNCHECKABLE,
        "A command (or code nested in it) that does not parse; a deny found in the part that "
        "parses still denies",
        "what the guard cannot read it cannot check",
    ),
    Rule(
        "too-complex",
        "unchecked",
        _UNCHECKABLE,
        f"A command over a size, nesting or parse-time limit ({MAX_BYTES // 1024} KiB, "
        f"{MAX_NESTING} levels, {MAX_NODES:,} syntax nodes, {MAX_PIPES:,} `|`, "
        f"{PARSE_SECONDS:g} s of parsing, code nested more than `max_depth` shells deep)",
        "checking it would cost more than running the guard is worth",
    ),
)
ON_INVOCATION = tuple((r.name, r.on_invocation) for r in RULES if r.on_invocation)
ON_COMMAND = tuple((r.name, r.on_command) for r in RULES if r.on_command)
BUILTIN_NAMES = tuple(r.name for r in RULES)


def rules_markdown() -> str:
    """The rule table as docs/policy-guard-rules.md holds it."""
    lines = [
        "# The command guard's built-in rules",
        "",
        "Generated from `RULES` in `supervisor/policy/guard/rules.py` by `rules_markdown()`; "
        "do not edit by hand (`python -m stockade.supervisor.policy.guard > "
        "docs/policy-guard-rules.md`). The first deny wins; then, if any part could not be "
        "checked, `guard.on_parse_error`; then the first ask; else the command runs. "
        "Configured `[[guard.rules]]` deny too.",
        "",
        "| Rule | Category | Action | Blocks | Why |",
        "|---|---|---|---|---|",
    ]
    lines += [
        "| "
        + " | ".join(_cell(c) for c in (f"`{r.name}`", r.category, r.action, r.blocks, r.why))
        + " |"
        for r in RULES
    ]
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")
