"""`python -m bench.transfer [--engine podman|docker] [--mib 512]`: upload and download of a
random file through Stockade's FileService (API), with checksums compared, in MB/s."""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.engines import bring_up
from bench.served import served
from stockade.client import Stockade

MiB = 1 << 20


def run_transfer_bench(engine: str, mib: int = 512) -> dict[str, Any]:
    bring_up(engine)
    with tempfile.TemporaryDirectory(prefix="stk-xfer-") as tmp:
        source, back = Path(tmp) / "src.bin", Path(tmp) / "back.bin"
        digest = hashlib.sha256()
        with source.open("wb") as out:
            for _ in range(mib):
                block = os.urandom(MiB)
                digest.update(block)
                out.write(block)
        with served(engine) as sup, Stockade(sup.target) as client:
            client.sandbox("xfer").ensure()
            started = time.perf_counter()
            up = client.upload("xfer", "big.bin", source)
            upload_s = time.perf_counter() - started
            started = time.perf_counter()
            down = client.download("xfer", "big.bin", back)
            download_s = time.perf_counter() - started
    size = mib * MiB
    return {
        "mib": mib,
        "upload_mb_s": round(size / upload_s / 1e6, 1),
        "download_mb_s": round(size / download_s / 1e6, 1),
        "checksums_match": up.sha256 == down.sha256 == digest.hexdigest(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.transfer")
    parser.add_argument("--engine", choices=["podman", "docker"], default="podman")
    parser.add_argument("--mib", type=int, default=512)
    ns = parser.parse_args()
    r = run_transfer_bench(ns.engine, ns.mib)
    print(
        f"{ns.engine}: {r['mib']} MiB upload {r['upload_mb_s']} MB/s, "
        f"download {r['download_mb_s']} MB/s, checksums match: {r['checksums_match']} "
        "(target >= 150 MB/s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
