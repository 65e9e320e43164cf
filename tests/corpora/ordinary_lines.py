# ruff: noqa: E501
"""Ordinary developer output for the scrubber's false-positive corpus: each generator returns
lines as the tool prints them, with hashes, ids, digests and base64 made from a seeded
generator."""

from __future__ import annotations

import base64
import json
import random
import uuid
from collections.abc import Callable

_WORDS = (
    "fix", "add", "token", "bucket", "refill", "parser", "retry", "cache", "session", "key",
    "rotate", "password", "reset", "flow", "docs", "bump", "deps", "test", "auth", "secret",
    "handling", "config", "loader", "worker", "queue", "timeout", "limit", "api", "client",
)  # fmt: skip
_PACKAGES = (
    "requests", "urllib3", "certifi", "idna", "charset-normalizer", "pydantic", "pydantic-core",
    "typing-extensions", "grpcio", "protobuf", "numpy", "pandas", "pytest", "pluggy", "rich",
    "tokenizers", "cryptography", "cffi", "pycparser", "jwt", "python-dotenv", "keyring",
)  # fmt: skip
_NPM = ("lodash", "react", "react-dom", "express", "jsonwebtoken", "dotenv", "axios", "chalk",
        "semver", "uuid", "debug", "ms", "minimist", "yargs", "webpack", "typescript")  # fmt: skip


def _hex(rng: random.Random, n: int) -> str:
    return rng.randbytes(n // 2 + 1).hex()[:n]


def _uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choices(_WORDS, k=n))


def git_log(rng: random.Random) -> list[str]:
    sha = _hex(rng, 40)
    return [
        f"commit {sha}",
        f"Author: Dev {rng.randrange(99)} <dev{rng.randrange(99)}@example.test>",
        f"Date:   Tue Nov {rng.randrange(1, 29)} 1{rng.randrange(10)}:0{rng.randrange(10)}:11 2026 +0100",
        "",
        f"    {_words(rng, 6).capitalize()}",
        "",
        f"{sha[:7]} {_words(rng, 5)}",
        f"{_hex(rng, 40)}",
        f" {rng.randrange(1, 9)} files changed, {rng.randrange(300)} insertions(+), {rng.randrange(90)} deletions(-)",
    ]  # fmt: skip


def pip(rng: random.Random) -> list[str]:
    name = rng.choice(_PACKAGES)
    version = f"{rng.randrange(1, 5)}.{rng.randrange(30)}.{rng.randrange(10)}"
    return [
        f"Collecting {name}=={version}",
        f"  Downloading {name.replace('-', '_')}-{version}-py3-none-any.whl ({rng.randrange(20, 900)} kB)",
        f"Requirement already satisfied: {rng.choice(_PACKAGES)} in ./.venv/lib/python3.11/site-packages",
        f"    --hash=sha256:{_hex(rng, 64)}",
        f"Successfully installed {name}-{version}",
    ]  # fmt: skip


def npm_lock(rng: random.Random) -> list[str]:
    name = rng.choice(_NPM)
    version = f"{rng.randrange(1, 19)}.{rng.randrange(30)}.{rng.randrange(10)}"
    integrity = base64.b64encode(rng.randbytes(64)).decode()
    sha1 = base64.b64encode(rng.randbytes(20)).decode()
    return [
        f'    "node_modules/{name}": {{',
        f'      "version": "{version}",',
        f'      "resolved": "https://registry.npmjs.org/{name}/-/{name}-{version}.tgz",',
        f'      "integrity": "sha512-{integrity}",',
        f"  integrity sha512-{integrity}",
        f'  resolved "https://registry.yarnpkg.com/{name}/-/{name}-{version}.tgz#{_hex(rng, 40)}"',
        f"  integrity sha1-{sha1}",
        f"added {rng.randrange(1, 900)} packages, and audited {rng.randrange(900, 1500)} packages in {rng.randrange(2, 40)}s",
    ]  # fmt: skip


def compiler(rng: random.Random) -> list[str]:
    n = rng.randrange(1, 400)
    return [
        f"src/parser.c:{n}:{rng.randrange(1, 80)}: error: 'token_len' undeclared (first use in this function)",
        f"  {n} |     if (token_len > MAX_TOKEN) return -1;",
        "      |         ^~~~~~~~~",
        f"error[E0308]: mismatched types --> src/auth.rs:{n}:17",
        f"src/api/client.ts({n},9): error TS2339: Property 'secretKey' does not exist on type 'Config'.",
        f"main.go:{n}:2: undefined: tokenSource",
    ]  # fmt: skip


def ls_ps(rng: random.Random) -> list[str]:
    return [
        f"-rw-r--r--  1 dev dev {rng.randrange(100, 99999):>6} Nov {rng.randrange(1, 29):>2} 10:{rng.randrange(60):02d} {rng.choice(_PACKAGES)}.py",
        f"drwxr-xr-x  {rng.randrange(2, 9)} dev dev   4096 Nov 25 09:12 {rng.choice(_WORDS)}",
        "lrwxrwxrwx  1 root root     34 Nov  2 08:00 python3 -> /usr/lib/python3.11/bin/python3",
        f"dev     {rng.randrange(1000, 99999):>5}  {rng.random() * 9:.1f}  1.{rng.randrange(10)} 912000 190000 pts/0 Sl+ 09:{rng.randrange(60):02d} 0:10 python -m pytest -x tests/",
        f"root        {rng.randrange(1, 999)}  0.0  0.1  18236  9876 ?        Ss   Nov24   0:02 /usr/sbin/sshd -D",
    ]  # fmt: skip


def containers(rng: random.Random) -> list[str]:
    digest = _hex(rng, 64)
    return [
        f"registry.example.test/app/{rng.choice(_WORDS)}   1.{rng.randrange(40)}   {digest[:12]}   2 days ago   {rng.randrange(40, 900)}MB",
        f"Digest: sha256:{digest}",
        f"docker.io/library/python@sha256:{_hex(rng, 64)}",
        f"{_hex(rng, 64)}",
        "Status: Downloaded newer image for python:3.11-slim",
        f"{_hex(rng, 12)}: Pull complete",
        f"{_words(rng, 1)}-{_hex(rng, 10)}-{_hex(rng, 5)}   1/1     Running   0          {rng.randrange(1, 59)}m",
    ]  # fmt: skip


def checksums(rng: random.Random) -> list[str]:
    return [
        f"{_hex(rng, 64)}  dist/stockade-0.{rng.randrange(9)}.{rng.randrange(9)}.tar.gz",
        f"{_hex(rng, 32)}  README.md",
        f"SHA512 ({rng.choice(_WORDS)}.iso) = {_hex(rng, 128)}",
        f"request_id={_uuid(rng)} trace_id={_hex(rng, 32)} span_id={_hex(rng, 16)}",
        f"{_uuid(rng)}",
        f'{{"id": "{_uuid(rng)}", "etag": "W/\\"{_hex(rng, 24)}\\"", "status": "ok"}}',
    ]  # fmt: skip


def fixtures(rng: random.Random) -> list[str]:
    """Base64 in tests and tools: encoded text, inline fixtures, `base64` output."""
    text = " ".join(rng.choices(_WORDS, k=rng.randrange(8, 20))).encode()
    blob = base64.b64encode(rng.randbytes(rng.choice((120, 200, 300)))).decode()
    wrapped = [blob[i : i + 76] for i in range(0, len(blob), 76)]
    return [
        f'    payload = base64.b64decode("{base64.b64encode(rng.randbytes(48)).decode()}")',
        f'    assert encode(b"{text.decode()[:30]}") == "{base64.b64encode(text[:30]).decode()}"',
        base64.b64encode(text).decode(),
        "$ base64 -w0 tests/data/sample.bin",
        base64.b64encode(rng.randbytes(rng.randrange(200, 900))).decode(),
        "$ base64 tests/data/sample.bin",
        *wrapped,
        f'  "image": "data:image/png;base64,iVBORw0KGgo{base64.b64encode(rng.randbytes(60)).decode()}",',
        f"const FIXTURE = '{base64.b64encode(json.dumps({'id': rng.randrange(999)}).encode()).decode()}';",
    ]  # fmt: skip


def minified(rng: random.Random) -> list[str]:
    n = rng.randrange(99)
    return [
        f'!function(e){{var t={{}};function n(r){{if(t[r])return t[r].exports;var o=t[r]={{i:r,l:!1,exports:{{}}}};return e[r].call(o.exports,o,o.exports,n),o.l=!0,o.exports}}n.m=e,n.c=t,n.d=function(e,t,r){{n.o(e,t)||Object.defineProperty(e,t,{{enumerable:!0,get:r}})}}}}([function(e,t){{e.exports="{n}"}}]);',
        f"const a{n}=(e,t)=>e.token?t(e.token):null,b{n}=e=>e.split('.').map(Number);export{{a{n} as getToken,b{n} as parseVersion}};",
        f".btn-{n}{{padding:4px 8px;border-radius:3px;background:#{_hex(rng, 6)};color:#fff}}",
    ]  # fmt: skip


def logs(rng: random.Random) -> list[str]:
    return [
        f"2026-11-25T10:{rng.randrange(60):02d}:{rng.randrange(60):02d}.{rng.randrange(999):03d}Z INFO  server: listening on 0.0.0.0:{rng.randrange(1024, 65000)}",
        f"2026-11-25 10:{rng.randrange(60):02d}:01,223 DEBUG auth: token refreshed for user {rng.randrange(9999)} (expires in 3600s)",
        f"[{rng.randrange(99999)}.{rng.randrange(999999):06d}] EXT4-fs (sda1): mounted filesystem with ordered data mode",
        f"Nov 25 10:{rng.randrange(60):02d}:11 host systemd[1]: Started session-{rng.randrange(999)}.scope - Session {rng.randrange(999)} of User dev.",
        f"tests/unit/test_{rng.choice(_WORDS)}.py::test_{rng.choice(_WORDS)}_{rng.choice(_WORDS)} PASSED [{rng.randrange(100):>3}%]",
        f"--- FAIL: Test{rng.choice(_WORDS).title()}Token ({rng.random():.2f}s)",
        f"arn:aws:iam::{rng.randrange(10**11, 10**12)}:role/{rng.choice(_WORDS)}-deployer",
        f"  + resource \"aws_s3_bucket\" \"{rng.choice(_WORDS)}\" {{ id = \"{_hex(rng, 20)}\" }}",
        f"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI{base64.b64encode(rng.randbytes(32)).decode()} dev@laptop",
        f"    password_hash = hashlib.sha256(salt + password).hexdigest()  # {rng.randrange(99)}",
        "Please enter your password: ",
        "  --token-file string   path to a file holding the token (default \"~/.config/x/token\")",
        "echo \"$REGISTRY_TOKEN\" | docker login ghcr.io -u dev --password-stdin",
        f"PWD=/home/dev/src/{rng.choice(_WORDS)}",
        f"max_tokens: {rng.choice((256, 1024, 4096))}",
        "tokenizer = AutoTokenizer.from_pretrained(model_name, use_fast=True)",
        f"    def __init__(self, token: str, timeout: float = {rng.randrange(1, 60)}.0) -> None:",
        "        self.token = token",
        "auth: fix the login redirect loop when the session expired",
        "pip install scikit-learn task-list desk-lamp risk-free",
        f"Set-Cookie-Policy: strict; max-age={rng.randrange(999)}",
        f"  keyCount: {rng.randrange(9)}, secretsManager: enabled, passwordPolicy: strong",
        f"{rng.choice(_WORDS)}_KEY_ID={_uuid(rng)}",
    ]  # fmt: skip


def certificate(rng: random.Random) -> list[str]:
    """A public certificate, whole: its body is base64 like a key's, after a public BEGIN."""
    body = base64.b64encode(b"0\x82\x03" + rng.randbytes(700)).decode()
    return [
        "-----BEGIN CERTIFICATE-----",
        *(body[i : i + 64] for i in range(0, len(body), 64)),
        "-----END CERTIFICATE-----",
    ]


_GENERATORS: tuple[Callable[[random.Random], list[str]], ...] = (
    git_log, pip, npm_lock, compiler, ls_ps, containers, checksums, fixtures, minified, logs,
)  # fmt: skip
MIN_LINES = 5000


def lines(rng: random.Random) -> list[str]:
    out: list[str] = []
    while len(out) < MIN_LINES:
        for generate in _GENERATORS:
            out += generate(rng)
        if rng.random() < 0.05:
            out += certificate(rng)
    return out


__all__ = ["MIN_LINES", "lines"]
