"""`make test`'s runner: every test, in three pytest processes side by side.

The integration and security tests are the long part, and most of their time is waiting on
an engine (a container starting, a pause, a timeout running out), so Podman's and Docker's
halves run at the same time, beside the unit tests (tests/conftest.py's SHARDS says which
test goes where). Each shard writes its own log under .test-logs/; a line a minute says where
each stands; at the end every shard's summary is printed, and the whole log of a shard that
failed. The exit status is non-zero if any shard failed.

    python scripts/run_tests.py [pytest arguments, given to every shard]

`python -m pytest` alone still runs everything in one process, as before.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.conftest import SHARDS  # noqa: E402

LOGS = ROOT / ".test-logs"
BASETEMP = Path("/tmp/stockade-pytest")
HEARTBEAT_S = 60.0
NO_TESTS = 5
"""pytest's exit status when a shard has nothing to run (arguments that select only another
shard's tests): not a failure."""
PROGRESS = re.compile(rb"\[\s*(\d+)%\]")


@dataclass
class Shard:
    name: str
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    log: IO[bytes] | None = None
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None

    def start(self, args: list[str]) -> None:
        self.log = self.log_path.open("wb")
        env = {**os.environ, "STOCKADE_TEST_SHARD": self.name, "PYTHONUNBUFFERED": "1"}
        command = [sys.executable, "-m", "pytest", f"--basetemp={BASETEMP / self.name}", *args]
        self.process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT
        )

    def poll(self) -> int | None:
        assert self.process is not None
        code = self.process.poll()
        if code is not None and self.ended is None:
            self.ended = time.monotonic()
            assert self.log is not None
            self.log.close()
        return code

    def progress(self) -> str:
        data = self.log_path.read_bytes()
        found = PROGRESS.findall(data[-4096:])
        return f"{int(found[-1])}%" if found else "starting"

    def minutes(self) -> str:
        end = self.ended if self.ended is not None else time.monotonic()
        return f"{(end - self.started) / 60:.1f} min"

    def summary(self) -> str:
        """The short summary and the final line, or the whole log if the shard failed."""
        text = self.log_path.read_text(errors="replace")
        if not self.ok():
            return text
        marker = text.rfind("short test summary info")
        if marker >= 0:
            return text[text.rfind("\n", 0, marker) + 1 :]
        return "\n".join(text.rstrip().splitlines()[-3:])

    def ok(self) -> bool:
        assert self.process is not None
        return self.process.returncode in (0, NO_TESTS)


def bring_up_engines() -> None:
    """Start both engines' services (and check their images) once, here, so the shards find
    them answering and never race to start the same one."""
    from tests.integration import harness

    for engine in ("podman", "docker"):
        harness.bring_up(engine)


def main(args: list[str]) -> int:
    LOGS.mkdir(exist_ok=True)
    BASETEMP.mkdir(parents=True, exist_ok=True)
    bring_up_engines()
    shards = [Shard(name, LOGS / f"{name}.log") for name in SHARDS]
    began = time.monotonic()
    try:
        for shard in shards:
            shard.start(args)
        print(f"tests: {len(shards)} shards side by side, logs in {LOGS}", flush=True)
        next_beat = time.monotonic() + HEARTBEAT_S
        while any([shard.poll() is None for shard in shards]):  # a list: every shard polled
            time.sleep(1.0)
            if time.monotonic() >= next_beat:
                next_beat += HEARTBEAT_S
                states = ", ".join(
                    f"{s.name} {s.progress() if s.ended is None else 'done'} ({s.minutes()})"
                    for s in shards
                )
                print(f"tests: {(time.monotonic() - began) / 60:.0f} min: {states}", flush=True)
    except KeyboardInterrupt:
        for shard in shards:
            if shard.process is not None and shard.process.poll() is None:
                shard.process.send_signal(signal.SIGINT)
        for shard in shards:
            if shard.process is not None:
                shard.process.wait()
        raise
    finally:
        from tests.integration import harness

        harness.stop_started_services()
    for shard in shards:
        verdict = "passed" if shard.ok() else "FAILED"
        print(f"\n===== shard {shard.name}: {verdict} in {shard.minutes()} =====", flush=True)
        print(shard.summary(), flush=True)
    total = (time.monotonic() - began) / 60
    failed = [shard.name for shard in shards if not shard.ok()]
    print(
        f"\ntests: {total:.1f} min; " + (f"FAILED: {', '.join(failed)}" if failed else "all passed")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
