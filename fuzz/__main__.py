"""`python -m fuzz`: atheris over each target for a fixed time, its corpus fuzz/corpus/<target>/
(read as seeds; each input libFuzzer found that added coverage is added to it afterwards,
which is then kept within MAX_FILES and MAX_BYTES).

    python -m fuzz [--seconds N] [TARGET ...]     every target (or those named), N s each

Each target runs in a child process of its own (`--child`, atheris takes the process). A
crash (an exception that is not one of the target's clean refusals, or a timeout) stops
that target, its input saved as fuzz/crashes/<target>-crash-<sha1>; the run goes on with
the next target and exits 1 at its end. Replay one input: `python -m fuzz --replay FILE
TARGET`."""

from __future__ import annotations

import argparse
import ast
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import fuzz

CRASHES = fuzz.HERE / "crashes"
MAX_FILES = 200
MAX_BYTES = 2 << 20
MAX_LEN = 64 << 10
"""The largest input libFuzzer makes (its -max_len)."""
TIMEOUT_S = 20
"""One input running longer is a crash (a hang)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fuzz", description=__doc__)
    parser.add_argument("targets", nargs="*", metavar="TARGET", help=", ".join(fuzz.TARGETS))
    parser.add_argument("--seconds", type=int, default=int(os.environ.get("FUZZ_SECONDS", 90)))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--replay", type=Path, help="run this one input through TARGET")
    args = parser.parse_args(argv)
    if args.replay:
        fuzz.check(fuzz.target(args.targets[0]), args.replay.read_bytes())
        print(f"{args.replay}: no crash")
        return 0
    if args.child:
        return _child(args.child, args.seconds, args.targets)
    names = args.targets or list(fuzz.TARGETS)
    for name in names:
        fuzz.target(name)  # an unknown name fails here, before any time is spent
    failed = [name for name in names if not _fuzz(name, args.seconds)]
    if failed:
        print(f"fuzz: crashes in {', '.join(failed)}: see {CRASHES}/", file=sys.stderr)
        return 1
    print(f"fuzz: {len(names)} targets, {args.seconds} s each, no crash")
    return 0


def _fuzz(name: str, seconds: int) -> bool:
    """Fuzz one target in a child process, what it found added to the corpus; False on a
    crash."""
    corpus = fuzz.CORPUS / name
    corpus.mkdir(parents=True, exist_ok=True)
    CRASHES.mkdir(exist_ok=True)
    print(f"fuzz: {name} for {seconds} s", flush=True)
    with tempfile.TemporaryDirectory(prefix=f"stockade-fuzz-{name}-") as found:
        command = [sys.executable, "-m", "fuzz", "--child", name, "--seconds", str(seconds)]
        ok = subprocess.run([*command, found], check=False).returncode == 0
        for path in Path(found).iterdir():  # libFuzzer writes (and reduces) only there
            shutil.copyfile(path, corpus / path.name)
    _bound(corpus)
    return ok


def _child(name: str, seconds: int, found: list[str]) -> int:
    import atheris  # only here: replaying the corpus (make test) needs no atheris

    module = _instrumented(atheris, name)

    def one_input(data: bytes) -> None:
        fuzz.check(module, data)

    atheris.Setup(
        [
            sys.argv[0],
            f"-max_total_time={seconds}",
            f"-max_len={MAX_LEN}",
            f"-timeout={TIMEOUT_S}",
            f"-artifact_prefix={CRASHES}/{name}-",
            "-rss_limit_mb=4096",
            *found,  # the first folder: where new inputs go
            str(fuzz.CORPUS / name),
        ],
        one_input,
    )
    atheris.Fuzz()
    return 0


def _instrumented(atheris: Any, name: str) -> Any:
    """The target module, what it imports of its INSTRUMENT packages instrumented."""
    source = (fuzz.HERE / f"{name}.py").read_text()
    packages = _instrument_of(source)
    with atheris.instrument_imports(include=list(packages)):
        return fuzz.target(name)


def _instrument_of(source: str) -> tuple[str, ...]:
    """A target's INSTRUMENT, read from its source (the module is imported only under the
    instrumenting hook, which must be set up before anything it imports)."""
    for line in source.splitlines():
        if line.startswith("INSTRUMENT = "):
            return tuple(str(v) for v in ast.literal_eval(line.split("=", 1)[1].strip()))
    raise ValueError("a fuzz target needs an INSTRUMENT line")


def _bound(corpus: Path) -> None:
    """At most MAX_FILES files and MAX_BYTES in the corpus: what libFuzzer added (named by
    its SHA-1) dropped before a named seed or kept crash, the largest first."""
    files = sorted(corpus.iterdir(), key=lambda p: (_found(p), p.stat().st_size, p.name))
    kept, total = 0, 0
    for path in files:
        size = path.stat().st_size
        if kept < MAX_FILES and total + size <= MAX_BYTES:
            kept, total = kept + 1, total + size
        else:
            path.unlink()


def _found(path: Path) -> bool:
    return len(path.name) == 40 and all(c in "0123456789abcdef" for c in path.name)


if __name__ == "__main__":
    sys.exit(main())
