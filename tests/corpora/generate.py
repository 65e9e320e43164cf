# ruff: noqa: E501
"""The scrubber's two corpora, generated at test time from a fixed seed (nothing generated is
committed: files full of fake tokens would only trip secret scanners).

- `credentials()`: fake credentials of every format in the table, each inside realistic
  surroundings (env files, JSON, YAML, logs, stack traces, curl lines, code, grep hits), plus
  keyword-labelled passwords and partial views of private keys (`sed -n`, `grep -n`,
  `cat -n`, `tail`, single lines). Each case is a text and the secret parts in it.
- `ordinary()`: lines of ordinary developer output (git, pip, npm, compilers, ls, ps,
  lockfiles with integrity hashes, image digests, UUIDs, checksums, base64 fixtures,
  minified code, certificates) that must pass untouched.

Fake credentials are random characters from a seeded generator: random-looking, never real.
`python -m tests.corpora.generate DIR` writes both to DIR for reading.

- `tldr_commands(pages)`: the command guard's real-world corpus, the examples of tldr-pages
  (https://github.com/tldr-pages/tldr, pages/common and pages/linux, CC BY 4.0, by the tldr-pages team
  and contributors) with their `{{placeholders}}` filled by plausible workspace-relative
  values (`_PLACEHOLDER_VALUES`). Generated from a tldr checkout named by $TLDR_PAGES (the
  pages are not copied into this repository);
  `python -m tests.corpora.generate tldr [FILE]` writes them one a line.
"""

from __future__ import annotations

import base64
import os
import random
import re
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path

from stockade.supervisor.policy.scrub.formats import FORMATS, Format, example
from tests.corpora import ordinary_lines

SEED = 20261125
PER_FORMAT = 6


@dataclass(frozen=True)
class Case:
    kind: str
    text: str
    secrets: tuple[str, ...]
    """What must not survive scrubbing (each checked in pieces: see `leaked`)."""


_SURROUNDINGS = (
    ("env", "export {NAME}={s}\n"),
    ("dotenv", '{NAME}="{s}"\n'),
    ("json", '{{"service": "{svc}", "region": "eu-west-1", "credential": "{s}", "retries": 3}}\n'),
    ("yaml", "deploy:\n  service: {svc}\n  credential: {s}\n  replicas: 2\n"),
    ("log", "2026-11-25T10:{mm}:07.118Z WARN  client: request rejected for {s} (status 401)\n"),
    (
        "traceback",
        "Traceback (most recent call last):\n"
        '  File "/srv/app/clients/{mod}.py", line {n}, in connect\n'
        '    raise AuthError(f"bad credential {{value}}")\n'
        "app.errors.AuthError: bad credential {s}\n",
    ),
    ("curl", "curl -sS -H 'X-Api: {s}' https://api.example.test/v1/items?page={n}\n"),
    ("ini", "[{mod}]\nendpoint = https://{mod}.example.test\ncredential = {s}\n"),
    ("code", 'client = {Svc}Client(endpoint="https://{mod}.example.test", secret="{s}")\n'),
    ("grep", "deploy/{mod}/values.yaml:{n}:  credential: {s}\n"),
    ("prose", "note: rotate {s} before friday\n"),
    ("docker", "docker run -e TOKEN_VALUE={s} --rm registry.example.test/{mod}:1.{n}\n"),
)


def _secret_part(fmt: Format, value: str) -> str:
    match = re.search(fmt.regex(), value)
    assert match is not None, (fmt.name, value)
    return match["s"]


def _format_cases(rng: random.Random) -> list[Case]:
    cases = []
    for fmt in FORMATS:
        for number in range(PER_FORMAT):
            kind, template = _SURROUNDINGS[
                (zlib.crc32(fmt.name.encode()) % 7 + number * 5) % len(_SURROUNDINGS)
            ]
            value = example(fmt, rng)
            mod = fmt.service.lower().replace(" ", "-").split("/")[0].strip("-") or "svc"
            text = template.format(
                s=value, NAME=fmt.name.upper().replace("-", "_") + "_VALUE", svc=fmt.service,
                Svc=fmt.service.title().replace(" ", "").replace(".", ""), mod=mod,
                mm=f"{rng.randrange(60):02d}", n=rng.randrange(2, 400),
            )  # fmt: skip
            cases.append(Case(f"{fmt.name}/{kind}", text, (_secret_part(fmt, value),)))
    return cases


_PASSWORD_CHARS = "abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789!#%*+-_."
_LABELLED = (
    "DB_PASSWORD={s}\n",
    'export SMTP_PASSWORD="{s}"\n',
    '{{"username": "svc-deploy", "password": "{s}"}}\n',
    "  client_secret: {s}\n",
    "aws_secret_access_key = {s}\n",
    "postgres://app:{s}@db.internal.test:5432/app\n",
    "machine git.example.test login deploy password {s}\n",
    "mysql -u root -p{s} -h 127.0.0.1 app\n",
    "curl -u deploy:{s} https://ci.example.test/job/build\n",
    "Authorization: Bearer {s}\n",
    "<Password>{s}</Password>\n",
    "sshpass -p {s} ssh deploy@10.0.0.4\n",
)


def _labelled_cases(rng: random.Random, count: int) -> list[Case]:
    cases = []
    for number in range(count):
        template = _LABELLED[number % len(_LABELLED)]
        secret = "".join(rng.choices(_PASSWORD_CHARS, k=rng.randint(16, 28)))
        if "Bearer" in template or "://" in template or "Password>" in template:
            secret = re.sub(r"[^A-Za-z0-9_.-]", "x", secret)
        cases.append(
            Case(f"labelled/{number % len(_LABELLED)}", template.format(s=secret), (secret,))
        )
    return cases


def fake_key_body(
    rng: random.Random, size: int, header: bytes = b"0\x82\x04\xa4\x02\x01"
) -> list[str]:
    """Lines of a fake private key body (PEM-wrapped base64 of random bytes): never a key."""
    raw = header + rng.randbytes(size)
    encoded = base64.b64encode(raw).decode()
    return [encoded[i : i + 64] for i in range(0, len(encoded), 64)]


def fake_openssh_body(rng: random.Random, size: int = 380) -> list[str]:
    raw = b"openssh-key-v1\x00" + rng.randbytes(size)
    encoded = base64.b64encode(raw).decode()
    return [encoded[i : i + 70] for i in range(0, len(encoded), 70)]


def _views(body: list[str], label: str, rng: random.Random) -> list[tuple[str, str, list[str]]]:
    """Partial views of a key: (kind, text, the body lines shown)."""
    start = rng.randrange(1, len(body) - 6)
    middle = body[start : start + 5]
    tail = body[-3:]
    return [
        ("sed-range", "\n".join(middle) + "\n", middle),
        ("grep-v-begin", "\n".join(body) + f"\n-----END {label}-----\n", body),
        ("grep-n", "".join(f"keys/deploy.pem:{start + i}:{line}\n" for i, line in enumerate(middle)), middle),
        ("cat-n", "".join(f"{start + i:>6}\t{line}\n" for i, line in enumerate(middle)), middle),
        ("tail", "\n".join(tail) + f"\n-----END {label}-----\n", tail),
        ("one-line", f"{body[start]}\n", [body[start]]),
        ("search-hit", f"id_deploy:{start}: {body[start]}\n", [body[start]]),
        ("read-range", "\n".join(body[2:12]) + "\n", body[2:12]),
    ]  # fmt: skip


def _partial_view_cases(rng: random.Random, keys: int) -> list[Case]:
    cases = []
    for number in range(keys):
        if number % 3 == 2:
            body, label = fake_openssh_body(rng), "OPENSSH PRIVATE KEY"
        else:
            body, label = fake_key_body(rng, rng.choice((600, 1190))), "RSA PRIVATE KEY"
        for kind, text, shown in _views(body, label, rng):
            cases.append(Case(f"partial-view/{kind}", text, tuple(shown)))
    return cases


def _random_token_cases(rng: random.Random, count: int) -> list[Case]:
    """A random token alone on its line: `cat token.txt`, `openssl rand -base64 32`."""
    cases = []
    for number in range(count):
        token = base64.b64encode(rng.randbytes(rng.choice((32, 48, 64)))).decode()
        if number % 2:
            token = token.rstrip("=").replace("+", "-").replace("/", "_")
        cases.append(Case("standalone-token", f"$ cat .secrets/api-token\n{token}\n$ \n", (token,)))
    return cases


def credentials(seed: int = SEED) -> list[Case]:
    rng = random.Random(seed)
    return [
        *_format_cases(rng),
        *_labelled_cases(rng, 120),
        *_partial_view_cases(rng, 15),
        *_random_token_cases(rng, 40),
    ]


def leaked(secret: str, output: str) -> bool:
    """Whether any 12 characters of the secret in a row (all of it if shorter) survive."""
    width = min(12, len(secret))
    return any(secret[i : i + width] in output for i in range(len(secret) - width + 1))


def ordinary(seed: int = SEED) -> list[str]:
    """Ordinary developer output, one string a line."""
    return ordinary_lines.lines(random.Random(seed))


TLDR_ENV = "TLDR_PAGES"
"""A tldr-pages checkout (its pages/common/*.md); unset: the tldr corpus is not available."""
_TLDR_PLATFORMS = ("common", "linux")
_EXAMPLE = re.compile(r"^`(.+)`$", re.MULTILINE)
_PLACEHOLDER = re.compile(r"\{\{(.*?)\}\}(?!\})")
_CHOICE = re.compile(r"\[([^\[\]]*\|[^\[\]]*)\]")
_KEYSTROKE = re.compile(r"<(?:[A-Z][A-Za-z0-9]*|[a-z])(?: [^<>]+)?>")
"""``<Ctrl c>``, ``<Space>``, ``<q>``: keys pressed in a program, not commands."""
_PLACEHOLDER_VALUES = {
    "command": "make", "command1": "make", "command2": "make test", "port": "8080",
    "n": "3", "number": "3", "count": "3", "10": "10", "username": "dev", "user": "dev",
    "password": "example-pass", "host": "example.com", "hostname": "example.com",
    "domain": "example.com", "url": "https://example.com", "ip_address": "192.0.2.10",
    "name": "demo", "package": "requests", "package_name": "requests", "value": "1",
    "version": "1.2.3", "target": "build", "branch_name": "main", "pattern": "TODO",
    "search_pattern": "TODO", "regex": "'^TODO'", "key": "color", "variable": "NAME",
}  # fmt: skip
"""Placeholders of tldr-pages and what fills them; any other keeps its own words."""


def _fill(placeholder: str, pick: int) -> str:
    """One placeholder's value: a choice (`[-v|--verbose]`, `f|d`) takes one alternative,
    an absolute example path becomes a workspace-relative one, a `...` list ends."""
    text = placeholder.replace(" ...", "").replace("...", "")
    if text in _PLACEHOLDER_VALUES:
        return _PLACEHOLDER_VALUES[text]
    whole = re.fullmatch(r"\[([^\[\]]*)\]", text)
    if whole and "|" in whole[1]:
        choices = whole[1].split("|")
        return choices[pick % len(choices)]
    text = _CHOICE.sub(lambda m: m[1].split("|")[0], text)
    if "|" in text and " " not in text:  # {{f|d}}
        text = text.split("|")[0]
    return text.replace("/path/to/", "path/to/")


def tldr_commands(pages: Path) -> list[str]:
    """Every example command of tldr-pages' common pages, placeholders filled, each once."""
    commands: dict[str, None] = {}
    for page in sorted(p for d in _TLDR_PLATFORMS for p in (pages / "pages" / d).glob("*.md")):
        for number, line in enumerate(_EXAMPLE.findall(page.read_text(encoding="utf-8"))):
            if not _KEYSTROKE.search(line):
                commands[_filled(line, zlib.crc32(page.name.encode()) + number)] = None
    return list(commands)


def _filled(line: str, pick: int) -> str:
    return _PLACEHOLDER.sub(lambda match: _fill(match[1], pick), line).strip()


def tldr_pages() -> Path | None:
    """The tldr checkout $TLDR_PAGES names, or None."""
    value = os.environ.get(TLDR_ENV)
    return Path(value) if value and (Path(value) / "pages" / "common").is_dir() else None


def main(argv: list[str]) -> int:
    if argv[1:2] == ["tldr"]:
        pages = tldr_pages()
        if pages is None:
            print(f"set {TLDR_ENV} to a tldr-pages checkout", file=sys.stderr)
            return 2
        commands = tldr_commands(pages)
        text = "".join(c.replace("\n", " ") + "\n" for c in commands)
        if len(argv) > 2:
            Path(argv[2]).write_text(text, encoding="utf-8")
        else:
            sys.stdout.write(text)
        return 0
    out = Path(argv[1] if len(argv) > 1 else "corpora-out")
    out.mkdir(parents=True, exist_ok=True)
    cases = credentials()
    (out / "credentials.txt").write_text("".join(f"### {c.kind}\n{c.text}" for c in cases))
    (out / "ordinary.txt").write_text("\n".join(ordinary()) + "\n")
    print(f"{len(cases)} credential cases, {len(ordinary())} ordinary lines in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
