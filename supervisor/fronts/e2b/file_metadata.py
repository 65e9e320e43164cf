"""envd 0.6.2's file metadata for the E2B front: a `/files` upload's `X-Metadata-<key>: value`
headers, kept on each written file as the extended attribute `user.e2b.<key>`, and read back
into the entries (`metadata`) of Stat, ListDir, Move, MakeDir and watch events.

The attributes are the truth, as on E2B: one a sandbox process sets itself (`setfattr`,
`os.setxattr`) shows in the entries too, and a file replaced by an upload without metadata has
none (each upload replaces the file's metadata). Both directions are commands through the
pipeline's `exec` tool (policy, the guard, audit, output scrubbing: a value that looks like a
credential comes back redacted, as any output does), run by the sandbox's `python3`:
`SET_SCRIPT` after the upload's transfer, `read_script` in the same command as find's fields.

The limits are envd's (its OpenAPI spec): keys and values printable US-ASCII (a key an HTTP
token, as the SDKs check it and as it must be to travel in a header name), a key at most
MAX_KEY_BYTES, all of a file's metadata (keys with the namespace prefix, plus values) at most
MAX_BYTES; a request past them is refused (400) before its body is read, so nothing is
written. Reading, a file's attributes are cut at the same MAX_BYTES (a sandbox process may set
more), so an entry never carries more than a write could have given it. Nothing here imports
the rest of the E2B front but connect's error."""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from typing import Final

from stockade.supervisor.fronts.e2b.connect import ConnectError, Json

PREFIX: Final = "user.e2b."
"""The extended attributes' namespace; keys are shown without it."""
HEADER: Final = b"x-metadata-"
MAX_KEY_BYTES: Final = 255 - len(PREFIX)
"""Linux's longest attribute name (255) less the prefix: 246, as envd."""
MAX_BYTES: Final = 4096
"""All of one file's metadata: each key with its prefix, and its value (envd's budget)."""
_PRINTABLE = frozenset(range(0x20, 0x7F))
_TOKEN = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789!#$%&'*+-.^_`|~")
"""A key is a header name's tail: an HTTP token (RFC 9110), as the SDKs check it."""

SET_SCRIPT: Final = (
    "import os,sys\n"
    "n=int(sys.argv[1]);kv=sys.argv[2:2+2*n]\n"
    "for p in sys.argv[2+2*n:]:\n"
    " for a in os.listxattr(p):\n"
    f"  if a.startswith({PREFIX!r}): os.removexattr(p,a)\n"
    f" for i in range(0,len(kv),2): os.setxattr(p,{PREFIX!r}+kv[i],kv[i+1].encode())\n"
)
"""Replace the `user.e2b.*` attributes of each path with the argv's keys and values: argv[1]
the number of keys n, then n keys and values in turn, then the paths. No module imported
(python3's start is the cost: json alone doubled it)."""

MARK: Final = "\x01e2b-metadata\t"
"""Begins read_command's line (find's fields begin with a type letter)."""
_READ_SCRIPT: Final = (
    "import os,sys\n"
    "e=lambda s: s.encode('unicode_escape').decode('ascii')\n"
    "out=[]\n"
    "for p in sys.stdin.buffer.read().split(b'\\0')[:-1]:\n"
    " p=os.fsdecode(p)\n"
    " try: names=sorted(n for n in os.listxattr(p) if n.startswith(" + repr(PREFIX) + "))\n"
    " except OSError: continue\n"
    " r=[e(p)];used=0\n"
    " for n in names:\n"
    "  try: v=os.getxattr(p,n)\n"
    "  except OSError: continue\n"
    "  used+=len(n)+len(v)\n"
    "  if used>BUDGET: break\n"
    f"  r+=[e(n[{len(PREFIX)}:]),e(v.decode('utf-8','replace'))]\n"
    " if len(r)>1: out.append('\\t'.join(r))\n"
    "sys.stdout.write(" + repr(MARK) + "+'\\v'.join(out)+'\\n')\n"
)
"""The `user.e2b.*` attributes of each NUL-ended path on stdin (following a symlink, as the
entry shows its target's type), on one line after MARK: a record per file (its path, then
keys and values, tab-separated), records apart by a vertical tab; each string escaped with
Python's unicode_escape (ASCII out, so no tab, vertical tab, newline or NUL of its own; a
printable ASCII value, what a write gives, reads as it is: the scrubber sees it)."""


def from_headers(headers: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """The metadata an upload's raw headers ask for (the ASGI scope's, names lowercased):
    the first of a repeated key wins, as envd. Refused (invalid_argument, HTTP 400) past the
    limits or outside printable ASCII."""
    found: dict[str, str] = {}
    used = 0
    for name, value in headers:
        if not name.lower().startswith(HEADER):
            continue
        raw_key = name[len(HEADER) :].lower()
        if not raw_key:
            raise ConnectError("invalid_argument", "a metadata key is empty (X-Metadata-)")
        if not all(b in _TOKEN for b in raw_key):
            raise ConnectError(
                "invalid_argument",
                "a metadata key must be printable US-ASCII, an HTTP token "
                "(letters, digits and !#$%&'*+-.^_`|~)",
            )
        key = raw_key.decode("ascii")
        if len(raw_key) > MAX_KEY_BYTES:
            raise ConnectError(
                "invalid_argument",
                f"metadata key {key[:32]!r}... is longer than {MAX_KEY_BYTES} bytes",
            )
        if not _printable(value):
            raise ConnectError(
                "invalid_argument", f"metadata value of {key!r} must be printable US-ASCII"
            )
        if key in found:
            continue
        used += len(PREFIX) + len(raw_key) + len(value)
        if used > MAX_BYTES:
            raise ConnectError(
                "invalid_argument",
                f"a file's metadata (keys with the {PREFIX} prefix, and values) is more "
                f"than {MAX_BYTES} bytes",
            )
        found[key] = value.decode("ascii")
    return found


def _printable(raw: bytes) -> bool:
    return all(b in _PRINTABLE for b in raw)


def set_command(metadata: dict[str, str], paths: Iterable[str]) -> str:
    """The command that gives each path (as the sandbox's shell names it) this metadata."""
    args = [str(len(metadata))] + [x for pair in metadata.items() for x in pair] + list(paths)
    return f"python3 -I -S -c {shlex.quote(SET_SCRIPT)} " + " ".join(shlex.quote(a) for a in args)


def read_command(find_args: str, budget: int = MAX_BYTES) -> str:
    """A command that prints, on its first line, the metadata of the entries `find
    find_args` names (`find_args` quoted already), keyed by find's path (%p); each file's
    cut at `budget` bytes."""
    script = _READ_SCRIPT.replace("BUDGET", str(int(budget)))
    return f"find {find_args} -print0 | python3 -I -S -c {shlex.quote(script)}"


def split_output(out: str) -> tuple[dict[str, dict[str, str]], str]:
    """read_command's line (path -> key -> value) and what follows it. No line (python3
    missing in a profile's image, or it failed): no metadata, the output as it came. A record
    that does not parse (cut, or redacted into something else) is left out."""
    if not out.startswith(MARK):
        return {}, out
    line, _, rest = out[len(MARK) :].partition("\n")
    found: dict[str, dict[str, str]] = {}
    for record in line.split("\v") if line else []:
        try:
            fields = [_unescaped(f) for f in record.split("\t")]
        except ValueError:
            continue
        if len(fields) % 2 == 1:
            found[fields[0]] = dict(zip(fields[1::2], fields[2::2], strict=True))
    return found, rest


def _unescaped(text: str) -> str:
    """unicode_escape undone (a surrogate, a path's byte that is not UTF-8, kept)."""
    return text.encode("ascii").decode("unicode_escape")


def attach(entry: Json, metadata: dict[str, str] | None) -> Json:
    """The entry with its metadata (absent when none, as envd's empty map)."""
    if metadata:
        entry["metadata"] = dict(metadata)
    return entry
