"""Real trees for the snapshot store's tests: make_tree (every kind of entry a snapshot keeps,
modes, links, mtimes, non-UTF-8 names), tree_of (what a snapshot keeps of a tree) and owned
(a tree as owned by other ids). The fixtures on them (store, tree) are in conftest.py."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import Any

from stockade.supervisor.sandboxes.snapshots.repository import RACY_NS

IDS = (4321, 8765)
NON_UTF8 = b"caf\xe9-\xff"


def settle() -> None:
    """Let the files written so far age past a walk's racy window (repository.RACY_NS), so
    that the next walk keeps their keys (one written within it is read again next time)."""
    time.sleep(RACY_NS / 1e9)


def tree_of(root: Path) -> dict[bytes, tuple[Any, ...]]:
    """Everything a snapshot keeps of `root`, walked by lstat: per relative bytes path, its
    kind, mode bits, content or link target, mtime and owner."""
    out: dict[bytes, tuple[Any, ...]] = {}
    base = os.fsencode(root)
    for folder, dirs, files in os.walk(base):
        for name in dirs + files:
            path = os.path.join(folder, name)
            info = os.lstat(path)
            rel = os.path.relpath(path, base)
            owner = (info.st_uid, info.st_gid)
            mode = stat.S_IMODE(info.st_mode)
            if stat.S_ISLNK(info.st_mode):
                out[rel] = ("l", os.readlink(path), info.st_mtime_ns, owner)
            elif stat.S_ISDIR(info.st_mode):
                out[rel] = ("d", mode, info.st_mtime_ns, owner)
            elif stat.S_ISREG(info.st_mode):
                with open(path, "rb") as f:
                    out[rel] = ("f", mode, f.read(), info.st_mtime_ns, owner)
            else:
                out[rel] = ("other", stat.S_IFMT(info.st_mode))
    return out


def owned(tree: dict[bytes, tuple[Any, ...]], ids: tuple[int, int]) -> dict[bytes, Any]:
    """`tree` as if every entry belonged to `ids`."""
    return {k: (*v[:-1], ids) if v[0] != "other" else v for k, v in tree.items()}


def make_tree(root: Path) -> None:
    (root / "sub" / "deep" / "er").mkdir(parents=True)
    (root / "empty").mkdir()
    (root / "sub" / "a.txt").write_text("hello\n")
    (root / "sub" / "deep" / "bin.dat").write_bytes(bytes(range(256)) * 100)
    (root / "empty-file").write_bytes(b"")
    script = root / "run.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o755)
    (root / "private").write_text("secret-ish")
    (root / "private").chmod(0o600)
    (root / "sub" / "deep" / "er").chmod(0o750)
    sticky = root / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    os.symlink("sub/a.txt", root / "rel-link")
    os.symlink("/etc/passwd", root / "passwd-link")
    os.symlink("does/not/exist", root / "dangling")
    os.symlink("..", root / "sub" / "up")
    odd = os.fsencode(root) + b"/" + NON_UTF8
    with open(odd, "wb") as f:
        f.write(b"latin-1 name")
    os.mkdir(os.fsencode(root) + b"/dir-" + NON_UTF8)
    os.utime(root / "sub" / "a.txt", ns=(1_000_000_123, 1_500_000_000_456_789))
    os.utime(root / "rel-link", ns=(5, 1_600_000_000_000_000_001), follow_symlinks=False)
    os.utime(root / "empty", ns=(7, 1_400_000_000_000_000_007))
