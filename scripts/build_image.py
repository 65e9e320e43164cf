"""Build the sandbox image for one engine (what `stockade image build` does).

Usage: .venv/bin/python scripts/build_image.py --engine podman|docker [--force]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from stockade.supervisor.image import ImageBuildError, build_image, default_cache_dir


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--engine", choices=["podman", "docker"], required=True)
    parser.add_argument("--force", action="store_true", help="build even if up to date")
    parser.add_argument("--cache-dir", type=Path, default=default_cache_dir())
    parser.add_argument("--quiet", action="store_true", help="hide the build log")
    ns = parser.parse_args()
    log = (lambda line: None) if ns.quiet else print
    start = time.monotonic()
    try:
        ref = build_image(ns.engine, cache_dir=ns.cache_dir, force=ns.force, log=log)
    except ImageBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{ns.engine}: {ref} ready in {time.monotonic() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
