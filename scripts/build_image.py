"""Build the sandbox image for one engine (what `stockade image build` does).

Usage: .venv/bin/python scripts/build_image.py --engine podman|docker [--force]
       [--cache-dir DIR] [--log-file FILE]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from stockade.supervisor.engines.image import ImageBuildError, build_image, default_cache_dir


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--engine", choices=["podman", "docker"], required=True)
    parser.add_argument("--force", action="store_true", help="build even if up to date")
    parser.add_argument("--cache-dir", type=Path, default=default_cache_dir())
    parser.add_argument("--log-file", type=Path, help="write the build log here, not to stdout")
    ns = parser.parse_args()
    start = time.monotonic()
    out = sys.stdout if ns.log_file is None else ns.log_file.open("a")

    def log(line: str) -> None:
        print(line, file=out, flush=True)

    try:
        ref = build_image(ns.engine, cache_dir=ns.cache_dir, force=ns.force, log=log)
    except ImageBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{ns.engine}: {ref} ready in {time.monotonic() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
