"""Honeytokens: decoy credentials, unique per sandbox, and the Tripwire that finds them.

A decoy is derived, never stored: HMAC-SHA256 under the installation's honeytoken key (a file
in the state directory, 0600, made once) over the sandbox id and the decoy's kind. So a
restarted supervisor knows the decoys of the sandboxes it adopts, and two sandboxes never
share one. They are in the formats real credentials have (an AWS access key id and secret,
GitHub personal access tokens with their CRC32 check digits), so that a scanner, or an
attacker, takes them for real; the scrubber's formats recognise them too (redacted from
output like any credential).

`Honeytokens` is the Tripwire (observe/alarms.py): one Hyperscan database of every decoy the
supervisor has planted since it started, in every form policy/encodings.py knows (literal,
base64 at each alignment, hex, percent, JSON and HTML escapes...), searched in one pass
whatever the number of sandboxes: a decoy sent encoded is caught as a literal one is. A hit
sounds an alarm on the sandbox whose call or request carried it, naming whose decoy it was:
sandbox A's decoy inside B's call is an alarm on B (A's secret leaked to B somehow, or B
guessed it: both worth an operator's eyes)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import zlib
from dataclasses import dataclass
from pathlib import Path

from stockade.supervisor.keys import sandbox_id, shown
from stockade.supervisor.observe.alarms import MAX_EVIDENCE, Alarm, AlarmSink, NoTripwire, Tripwire
from stockade.supervisor.policy.encodings import Forms, forms, longest_form
from stockade.supervisor.policy.scrub.engine import as_bytes

log = logging.getLogger("stockade")

KEY_FILE = "honeytokens.key"
KEY_BYTES = 32
LONGEST = 40
"""The longest decoy (an AWS secret access key, a ghp_ token): what a stream keeps back."""
UPPER32 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
BASE64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
HIDDEN = "[honeytoken]"
"""What stands for a decoy in an alarm's evidence."""


def load_key(state_dir: Path) -> bytes:
    """The installation's honeytoken key (STATE_DIR/honeytokens.key, 0600), made on first
    use. A file of another size fails the start with an OSError naming it (never replaced:
    the decoys already planted would no longer be known)."""
    path = state_dir / KEY_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError as exc:
            raise OSError(f"cannot read the honeytoken key {path}: {exc.strerror}") from None
        with os.fdopen(fd, "rb") as file:
            data = file.read(KEY_BYTES + 1)
        if len(data) != KEY_BYTES:
            raise OSError(f"{path} holds {len(data)} bytes, not a {KEY_BYTES}-byte key") from None
        return data
    key = os.urandom(KEY_BYTES)
    try:
        os.write(fd, key)
        os.fsync(fd)
    finally:
        os.close(fd)
    return key


def _draw(key: bytes, sid: str, kind: str, alphabet: str, count: int) -> str:
    """`count` characters of `alphabet`, uniform, from HMAC-SHA256(key, sid, kind, block)."""
    limit = 256 - 256 % len(alphabet)
    out: list[str] = []
    block = 0
    while len(out) < count:
        message = f"stockade-honeytoken\0{sid}\0{kind}\0{block}".encode()
        for byte in hmac.new(key, message, hashlib.sha256).digest():
            if byte < limit and len(out) < count:
                out.append(alphabet[byte % len(alphabet)])
        block += 1
    return "".join(out)


def github_token(key: bytes, sid: str, kind: str) -> str:
    """ghp_ + 30 random base62 + the CRC32 of those 30 in 6 base62 digits (GitHub's own
    token format: a scanner that checks the digits takes it for real)."""
    body = _draw(key, sid, kind, BASE62, 30)
    crc = zlib.crc32(body.encode())
    digits = ""
    for _ in range(6):
        crc, rest = divmod(crc, 62)
        digits = BASE62[rest] + digits
    return f"ghp_{body}{digits}"


@dataclass(frozen=True)
class Decoys:
    """One sandbox's decoys, and the files and variable that carry them."""

    sandbox_key: str
    aws_key_id: str
    aws_secret: str
    github: str
    netrc: str
    dotenv_key_id: str
    dotenv_secret: str
    dotenv_github: str
    env: str

    def tokens(self) -> dict[str, str]:
        """Each decoy and where it was planted, for the alarm's words."""
        return {
            self.aws_key_id: "AWS access key id in ~/.aws/credentials",
            self.aws_secret: "AWS secret access key in ~/.aws/credentials",
            self.github: "GitHub token in ~/.config/gh/hosts.yml",
            self.netrc: "GitHub token in ~/.netrc",
            self.dotenv_key_id: "AWS access key id in a planted .env file",
            self.dotenv_secret: "AWS secret access key in a planted .env file",
            self.dotenv_github: "GitHub token in a planted .env file",
            self.env: "value of the planted environment variable",
        }

    def aws_file(self) -> str:
        return (
            f"[default]\naws_access_key_id = {self.aws_key_id}\n"
            f"aws_secret_access_key = {self.aws_secret}\nregion = us-east-1\n"
        )

    def gh_file(self) -> str:
        return (
            f"github.com:\n    oauth_token: {self.github}\n    user: deploy-bot\n"
            "    git_protocol: https\n"
        )

    def netrc_file(self) -> str:
        return f"machine github.com\nlogin deploy-bot\npassword {self.netrc}\n"

    def dotenv_file(self) -> str:
        return (
            f"AWS_ACCESS_KEY_ID={self.dotenv_key_id}\n"
            f"AWS_SECRET_ACCESS_KEY={self.dotenv_secret}\n"
            f"GITHUB_TOKEN={self.dotenv_github}\n"
        )


def derive(key: bytes, sandbox_key: str, env_var: str = "AWS_SECRET_ACCESS_KEY") -> Decoys:
    """The decoys of a sandbox (by its scoped key), the same on every start."""
    sid = sandbox_id(sandbox_key)
    upper = env_var.upper()
    env = (
        _draw(key, sid, "env-aws", BASE64, 40)
        if "AWS" in upper and "SECRET" in upper
        else github_token(key, sid, "env")
    )
    return Decoys(
        sandbox_key=sandbox_key,
        aws_key_id="AKIA" + _draw(key, sid, "aws-id", UPPER32, 16),
        aws_secret=_draw(key, sid, "aws-secret", BASE64, 40),
        github=github_token(key, sid, "github"),
        netrc=github_token(key, sid, "netrc"),
        dotenv_key_id="AKIA" + _draw(key, sid, "dotenv-id", UPPER32, 16),
        dotenv_secret=_draw(key, sid, "dotenv-secret", BASE64, 40),
        dotenv_github=github_token(key, sid, "dotenv"),
        env=env,
    )


@dataclass(frozen=True)
class Hit:
    owner: str
    """The scoped key of the sandbox the decoy was planted in."""
    what: str
    token: str
    seen: str = ""
    """The text that matched: the decoy itself, or one of its encoded forms."""


class Honeytokens:
    """The Tripwire over every decoy planted since this supervisor started.

    Compiling a Hyperscan database takes ~0.6 ms a sandbox's decoys, too long to redo on the
    event loop for every new sandbox of a thousand. So the decoys live in generations, each
    a database compiled in a worker thread (settle), merged as a binary counter merges (a
    generation is folded into the next one's compile when that one is not bigger): each
    decoy is compiled O(log n) times in all, and a search scans O(log n) databases. Decoys
    not compiled yet (the last sandbox's, until settle() has run) are searched one by one."""

    longest = longest_form(LONGEST)
    """The longest form of the longest decoy (every character as `&#NNN;`)."""

    def __init__(self, key: bytes, alarm: AlarmSink, env_var: str = "AWS_SECRET_ACCESS_KEY"):
        self._key = key
        self._alarm = alarm
        self._env_var = env_var
        self._owners: dict[str, tuple[str, str]] = {}
        self._generations: list[tuple[Forms, list[str]]] = []
        self._pending: list[str] = []
        self._pending_forms: dict[str, list[tuple[bytes, bool]]] = {}
        self._settling = asyncio.Lock()
        self._known: dict[str, Decoys] = {}

    def decoys(self, sandbox_key: str) -> Decoys:
        """The sandbox's decoys, known to the tripwire from now on (searched one by one until
        settle() has compiled them)."""
        found = self._known.get(sandbox_key)
        if found is not None:
            return found
        made = derive(self._key, sandbox_key, self._env_var)
        self._known[sandbox_key] = made
        for token, what in made.tokens().items():
            if token not in self._owners:
                self._owners[token] = (sandbox_key, what)
                self._pending.append(token)
                self._pending_forms[token] = forms(token.encode())
        return made

    async def settle(self) -> None:
        """Compile the decoys not compiled yet, in a worker thread (never on the loop)."""
        async with self._settling:
            while self._pending:
                words = list(self._pending)
                gens = list(self._generations)
                merged, drop = words, 0
                while drop < len(gens) and len(gens[-1 - drop][1]) <= len(merged):
                    merged = gens[-1 - drop][1] + merged
                    drop += 1
                database = await asyncio.to_thread(Forms, [w.encode() for w in merged])
                self._generations = [*gens[: len(gens) - drop], (database, merged)]
                del self._pending[: len(words)]
                for word in words:
                    self._pending_forms.pop(word, None)

    @property
    def armed(self) -> bool:
        """Whether any decoy is known (else every search finds nothing)."""
        return bool(self._owners)

    @property
    def generations(self) -> int:
        return len(self._generations)

    def find(self, data: bytes | str) -> list[Hit]:
        """Every known decoy in data, each once, in the order they first appear."""
        if not self._owners or not data:
            return []
        raw = as_bytes(data) if isinstance(data, str) else bytes(data)
        found: dict[str, tuple[int, bytes]] = {}
        for database, words in self._generations:
            for start, end, ident in database.spans(raw):
                token = words[database.owners[ident]]
                if token not in found or end < found[token][0]:
                    found[token] = (end, raw[start:end])
        folded = b""
        for token in self._pending:
            for form, caseless in self._pending_forms.get(token, ()):
                if caseless:
                    folded = folded or raw.lower()
                    at = folded.find(form.lower())
                else:
                    at = raw.find(form)
                end = at + len(form)
                if at >= 0 and (token not in found or end < found[token][0]):
                    found[token] = (end, raw[at:end])
        out = []
        for token, (_end, seen) in sorted(found.items(), key=lambda item: item[1][0]):
            owner, what = self._owners[token]
            out.append(Hit(owner, what, token, seen.decode("ascii", "replace")))
        return out

    def check(self, sandbox_key: str, where: str, data: bytes | str, evidence: str = "") -> bool:
        """True, and one alarm sounded on `sandbox_key`, when data carries a decoy."""
        found = self.find(data)
        if not found:
            return False
        self._alarm(
            Alarm(
                sandbox_key=sandbox_key,
                kind="honeytoken",
                where=where,
                detail=describe(sandbox_key, where, found),
                evidence=self.hide(evidence)[:MAX_EVIDENCE],
            )
        )
        return True

    def hide(self, text: str) -> str:
        """text with every known decoy in it, in whichever form, replaced by HIDDEN (for
        evidence)."""
        for hit in self.find(text):
            text = text.replace(hit.token, HIDDEN).replace(hit.seen or hit.token, HIDDEN)
        return text


def describe(sandbox_key: str, where: str, found: list[Hit]) -> str:
    """The alarm's words: which decoys (by whose sandbox and place), seen where."""
    seen = "read (in output)" if where == "output" else f"used (in {where})"
    parts = []
    for hit in found[:4]:
        whose = "its own" if hit.owner == sandbox_key else f"sandbox {shown(hit.owner)!r}'s"
        parts.append(f"{whose} {hit.what}")
    more = f" and {len(found) - 4} more" if len(found) > 4 else ""
    return f"honeytoken {seen}: {'; '.join(parts)}{more}"


def as_tripwire(honey: Honeytokens | None) -> Tripwire:
    """What the egress proxy takes (EgressProxy(tripwire=...)): the decoys' tripwire, or
    NoTripwire when honeytokens are off. Typed, so that Honeytokens stays a Tripwire."""
    return NoTripwire() if honey is None else honey
