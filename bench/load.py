"""Load: many keys, each a script of mixed tool calls (write, read, edit, list, glob, search,
exec with and without stdin), from concurrent clients: threads sharing a few sync channels and
asyncio tasks on a few asyncio channels. Each key's calls run one after another, so every result
is checked against what the script wrote before; all keys run at once.

Used by `make bench` (throughput and latency percentiles) and by tests/integration/test_load.py
(no errors allowed).
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from bench.timing import summarize
from stockade.client import AsyncStockade, Stockade, StockadeError, ToolResult

DEADLINE_S = 120.0
"""The client's deadline for each call: a hung call is an error, not a stall."""
MAX_ERRORS_KEPT = 20


@dataclass(frozen=True)
class Step:
    tool: str
    args: dict[str, Any]
    check: Callable[[ToolResult], str | None]
    """None when the result is what the script expects, else what is wrong."""


def _text(i: int, key: str) -> str:
    return f"key {key} step {i}\nmarker tok{i}x here\n" + "filler line\n" * (i % 9)


Check = Callable[[dict[str, Any]], bool]
"""Whether a call's data is what the script expects."""


def _expect_ok(check: Check) -> Callable[[ToolResult], str | None]:
    def run(result: ToolResult) -> str | None:
        if result.is_error:
            return f"{result.error_code}: {result.error_message[:200]}"
        try:
            good = check(result.data)
        except (KeyError, TypeError, AttributeError):
            good = False
        return None if good else f"unexpected data {str(result.data)[:300]}"

    return run


def script(key: str, n: int) -> list[Step]:
    """n mixed calls for one key; each check knows the workspace the previous steps made."""
    files: dict[str, str] = {}
    steps: list[Step] = []
    last = ""
    for i in range(n):
        kind = i % 8 if files else 0
        if kind == 0:
            last = f"d{i % 4}/f{i % 11}.txt"
            files[last] = content = _text(i, key)
            size = len(content.encode())
            steps.append(
                Step("write_file", {"path": last, "content": content},
                     _expect_ok(_equal("bytes_written", size)))
            )  # fmt: skip
        elif kind == 1:
            want = files[last]
            steps.append(Step("read_file", {"path": last}, _expect_ok(_equal("content", want))))
        elif kind == 2:
            token = re.search(r"tok\d+x", files[last])
            if token is None:  # edited before: write it afresh next time
                steps.append(Step("glob", {"pattern": "**/*.txt"}, _glob_check(files)))
                continue
            old, new = token[0], token[0].upper()
            files[last] = files[last].replace(old, new, 1)
            steps.append(
                Step("edit_file", {"path": last, "old_text": old, "new_text": new},
                     _expect_ok(lambda d: d["replacements"] == 1))
            )  # fmt: skip
        elif kind == 3:
            folder = last.split("/")[0]
            names = sorted(p.split("/")[1] for p in files if p.startswith(folder + "/"))
            steps.append(
                Step("list_files", {"path": folder},
                     _expect_ok(_names(names)))
            )  # fmt: skip
        elif kind == 4:
            steps.append(Step("glob", {"pattern": "**/*.txt"}, _glob_check(files)))
        elif kind == 5:
            hits = sorted(p for p, text in files.items() if re.search(r"TOK\d+X", text))
            steps.append(
                Step("search", {"pattern": r"TOK\d+X", "max_results": 100},
                     _expect_ok(_hit_files(hits)))
            )  # fmt: skip
        elif kind == 6:
            size = len(files[last].encode())
            steps.append(
                Step("exec", {"command": f"wc -c < {last}"},
                     _expect_ok(_printed(f"{size}\n")))
            )  # fmt: skip
        else:
            word = f"in-{key}-{i}"
            upper = word.upper()
            steps.append(
                Step("exec", {"command": "tr a-z A-Z", "stdin": word},
                     _expect_ok(_equal("stdout", upper)))
            )  # fmt: skip
    return steps


def _equal(field: str, want: object) -> Check:
    return lambda d: bool(d[field] == want)


def _names(want: list[str]) -> Check:
    return lambda d: [e["name"] for e in d["entries"]] == want


def _hit_files(want: list[str]) -> Check:
    return lambda d: sorted(m["file"] for m in d["matches"]) == want


def _printed(stdout: str) -> Check:
    return lambda d: d["exit_code"] == 0 and bool(d["stdout"] == stdout)


def _glob_check(files: dict[str, str]) -> Callable[[ToolResult], str | None]:
    want = sorted(files)
    return _expect_ok(lambda d: d["matches"] == want)


@dataclass
class LoadReport:
    keys: int
    calls_per_key: int
    samples: list[float] = field(default_factory=list)
    by_tool: dict[str, list[float]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    error_count: int = 0
    seconds: float = 0.0
    setup_seconds: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, tool: str, seconds: float, problem: str | None, where: str) -> None:
        with self._lock:
            self.samples.append(seconds)
            self.by_tool.setdefault(tool, []).append(seconds)
            if problem is not None:
                self.error_count += 1
                if len(self.errors) < MAX_ERRORS_KEPT:
                    self.errors.append(f"{where} {tool}: {problem}")

    def summary(self) -> dict[str, Any]:
        calls = len(self.samples)
        return {
            "keys": self.keys,
            "calls_per_key": self.calls_per_key,
            "calls": calls,
            "errors": self.error_count,
            "first_errors": self.errors,
            "seconds": round(self.seconds, 2),
            "setup_seconds": round(self.setup_seconds, 2),
            "throughput_per_s": round(calls / self.seconds, 1) if self.seconds else 0.0,
            **(summarize(self.samples) if self.samples else {}),
            "by_tool": {tool: summarize(s) for tool, s in sorted(self.by_tool.items())},
        }


def _problem_of(exc: StockadeError) -> str:
    return f"{exc.code} {exc.reason}: {str(exc)[:200]}"


def _run_sync(client: Stockade, key: str, steps: list[Step], report: LoadReport) -> None:
    for n, step in enumerate(steps):
        started = time.perf_counter()
        try:
            result = client.call(key, step.tool, step.args, deadline=DEADLINE_S)
            problem = step.check(result)
        except StockadeError as exc:
            problem = _problem_of(exc)
        report.record(step.tool, time.perf_counter() - started, problem, f"{key}#{n}")


async def _run_async(
    client: AsyncStockade, key: str, steps: list[Step], report: LoadReport
) -> None:
    for n, step in enumerate(steps):
        started = time.perf_counter()
        try:
            result = await client.call(key, step.tool, step.args, deadline=DEADLINE_S)
            problem = step.check(result)
        except StockadeError as exc:
            problem = _problem_of(exc)
        report.record(step.tool, time.perf_counter() - started, problem, f"{key}#{n}")


async def _async_side(
    target: str, keys: list[str], n: int, channels: int, report: LoadReport
) -> None:
    clients = [AsyncStockade(target) for _ in range(channels)]
    try:
        await asyncio.gather(
            *(
                _run_async(clients[i % channels], k, script(k, n), report)
                for i, k in enumerate(keys)
            )
        )
    finally:
        for client in clients:
            await client.close()


def _ensure_all(target: str, keys: list[str], workers: int) -> None:
    """Create every sandbox first (cold starts are measured elsewhere)."""
    with Stockade(target) as client, ThreadPoolExecutor(workers) as pool:
        list(pool.map(client.ensure_sandbox, keys))


def run_load(
    target: str,
    *,
    keys: int = 50,
    calls: int = 200,
    prefix: str = "load",
    sync_channels: int = 3,
    async_channels: int = 2,
) -> dict[str, Any]:
    """keys x calls mixed calls: half the keys on threads (one per key, sharing sync_channels
    channels), half as asyncio tasks (sharing async_channels channels), all at once."""
    names = [f"{prefix}-{i:03}" for i in range(keys)]
    report = LoadReport(keys, calls)
    started = time.perf_counter()
    _ensure_all(target, names, workers=8)
    report.setup_seconds = time.perf_counter() - started
    threaded, tasks = names[: keys // 2], names[keys // 2 :]
    sync_clients = [Stockade(target) for _ in range(sync_channels)]
    started = time.perf_counter()
    try:
        with ThreadPoolExecutor(len(threaded) + 1) as pool:
            futures = [
                pool.submit(asyncio.run, _async_side(target, tasks, calls, async_channels, report))
            ]
            futures += [
                pool.submit(_run_sync, sync_clients[i % sync_channels], k, script(k, calls), report)
                for i, k in enumerate(threaded)
            ]
            for future in futures:
                future.result()
    finally:
        for client in sync_clients:
            client.close()
    report.seconds = time.perf_counter() - started
    return report.summary()
