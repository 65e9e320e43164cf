"""`stockade cp`: files and directories between this machine and a sandbox, through the
public client API only (FileService), with a progress bar on a terminal."""

from __future__ import annotations

import os
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from stockade.client import CallContext, FileInfo, Stockade, StockadeError


def split_remote(spec: str) -> tuple[str, str] | None:
    """KEY:PATH -> (KEY, PATH); a local path (no colon, or ./ or / first) -> None."""
    if spec.startswith(("/", "./", "../")) or ":" not in spec:
        return None
    key, _, path = spec.partition(":")
    return (key, path or ".") if key else None


def copy(
    client: Stockade, source: str, dest: str, recursive: bool, context: CallContext
) -> FileInfo:
    remote_src, remote_dest = split_remote(source), split_remote(dest)
    if (remote_src is None) == (remote_dest is None):
        raise StockadeError("cp: exactly one side must be KEY:PATH")
    if remote_dest is not None:
        return _upload(client, Path(source), *remote_dest, recursive, context)
    assert remote_src is not None
    return _download(client, *remote_src, Path(dest), recursive, context)


def _upload(
    client: Stockade, local: Path, key: str, path: str, recursive: bool, context: CallContext
) -> FileInfo:
    if local.is_dir() != recursive:
        raise StockadeError(f"cp: {local} is {'a' if local.is_dir() else 'not a'} directory; "
                            "use -r for directories")  # fmt: skip
    if not recursive:
        bar = Progress(local.stat().st_size)
        try:
            return client.upload(key, path, local, context=context, progress=bar.add)
        finally:
            bar.done()
    with tempfile.TemporaryFile() as packed:
        with tarfile.open(fileobj=packed, mode="w") as tar:
            tar.add(local, arcname=".")
        size = packed.tell()
        packed.seek(0)
        bar = Progress(size)
        try:
            return client.upload(key, path, packed, tar=True, context=context, progress=bar.add)
        finally:
            bar.done()


def _download(
    client: Stockade, key: str, path: str, local: Path, recursive: bool, context: CallContext
) -> FileInfo:
    if local.is_dir() and not recursive:
        local = local / Path(path).name
    bar = Progress(None)
    try:
        if not recursive:
            return client.download(key, path, local, context=context, progress=bar.add)
        with tempfile.TemporaryFile() as packed:
            info = client.download(key, path, packed, tar=True, context=context, progress=bar.add)
            packed.seek(0)
            local.mkdir(parents=True, exist_ok=True)
            with tarfile.open(fileobj=packed, mode="r") as tar:
                tar.extractall(local, filter=_data_or_skip)
            return info
    finally:
        bar.done()


def _data_or_skip(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
    """tarfile's "data" filter, skipping (with a note on stderr) what it refuses instead of
    stopping: links to absolute paths or out of the destination, FIFOs and devices. What the
    sandbox packed never writes outside the destination."""
    try:
        return tarfile.data_filter(member, dest)
    except tarfile.FilterError as exc:
        name = member.name.removeprefix("./")
        print(f"stockade cp: skipped {name}: {exc}", file=sys.stderr)
        return None


class Progress:
    """A one-line progress bar on stderr when it is a terminal; silent otherwise."""

    def __init__(self, total: int | None) -> None:
        self.total, self.sent = total, 0
        self.started = self.shown = time.monotonic()
        self.live = os.isatty(sys.stderr.fileno())

    def add(self, n: int) -> None:
        self.sent += n
        now = time.monotonic()
        if self.live and now - self.shown > 0.1:
            self.shown = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        rate = self.sent / max(now - self.started, 1e-6) / 1e6
        mib = self.sent / (1 << 20)
        if self.total:
            share = self.sent / self.total
            bar = "#" * int(share * 30)
            line = f"[{bar:<30}] {share:4.0%} {mib:8.1f} MiB {rate:7.1f} MB/s"
        else:
            line = f"{mib:8.1f} MiB {rate:7.1f} MB/s"
        sys.stderr.write("\r" + line)
        sys.stderr.flush()

    def done(self) -> None:
        if self.live:
            self._draw(time.monotonic())
            sys.stderr.write("\n")
