"""`python -m bench.scrub`: how long the credential scrubber takes on 4 KiB and 1 MiB of
typical tool output (ls, git log, pip, ps, a traceback, a lockfile, JSON) with a few
secrets in it, and two configured literal secrets. No container engine needed."""

from __future__ import annotations

import hashlib
import json
import sys
import uuid
from functools import partial
from typing import Any

from bench.timing import time_calls
from stockade.supervisor.policy.scrub import Scrubber

CONFIGURED = ("db-password-0f9e8d7c", "internal-api-key-5a4b3c2d1e")
SECRETS = (
    "export OPENAI_API_KEY=sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z_AbCdEf\n",
    "GITHUB_TOKEN=ghp_0123456789abcdefghijABCDEFGHIJabcdef\n",
    "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n",
    "curl -H 'Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl' https://x\n",
    "DATABASE_URL=postgres://app:db-password-0f9e8d7c@db.internal:5432/app\n",
)
"""One of these after every 40th block, starting with the second."""


def block(i: int) -> str:
    """About 1.4 KB of ordinary output; i varies hashes, ids and times."""
    sha = hashlib.sha1(str(i).encode()).hexdigest()
    digest = hashlib.sha256(str(i).encode()).hexdigest()
    item = {"id": str(uuid.UUID(int=i)), "name": f"widget {i}", "status": "ok", "retries": i % 3}
    return (
        f"drwxr-xr-x  5 dev dev  4096 Mar  3 12:{i % 60:02d} src\n"
        "-rw-r--r--  1 dev dev  1532 Mar  3 12:01 pyproject.toml\n"
        f"{sha[:7]} Fix token bucket refill when the rate changes\n"
        f"{sha[7:14]} Merge pull request #{i} from dev/task-list\n"
        "Collecting requests>=2.31 (from -r requirements.txt (line 3))\n"
        "Requirement already satisfied: tokenizers in ./.venv/lib/python3.11/site-packages\n"
        f"dev       {1000 + i}  1.2  2.3 912000 190000 pts/0 Sl+  09:{i % 60:02d}   0:10 "
        "python -m pytest -x tests/\n"
        "Traceback (most recent call last):\n"
        f'  File "/home/dev/app/main.py", line {i % 300}, in <module>\n'
        f"KeyError: 'session_{uuid.UUID(int=i * 7)}'\n"
        f'      "resolved": "https://registry.npmjs.org/lodash/-/lodash-4.17.{i % 30}.tgz",\n'
        f"sha256:{digest}\n"
        f"{json.dumps(item)}\n"
        f"12:{i % 60:02d}:33 INFO server: listening on 0.0.0.0:8080, {i} requests served\n"
    )


def sample_text(size: int) -> str:
    parts, length, i = [], 0, 0
    while length < size:
        part = block(i) + (SECRETS[i // 40 % len(SECRETS)] if i % 40 == 1 else "")
        parts.append(part)
        length, i = length + len(part), i + 1
    return "".join(parts)[:size]


def run_scrub_bench() -> dict[str, Any]:
    """Scrubber.scrub timed on 4 KiB (200 runs) and 1 MiB (30 runs), each after a warm-up."""
    scrubber = Scrubber(CONFIGURED)
    results: dict[str, Any] = {}
    for label, size, n in (("4KiB", 4096, 200), ("1MiB", 1 << 20, 30)):
        text = sample_text(size)
        figures = time_calls(partial(scrubber.scrub, text), n, warmup=max(n // 10, 3))
        results[label] = {**figures, "redactions": scrubber.scrub(text)[1]}
    return results


def main() -> int:
    results = run_scrub_bench()
    print("Scrubber.scrub on typical tool output (ms)")
    print(f"{'text':6} {'n':>4} {'min':>8} {'median':>8} {'p95':>8}  redactions")
    for label, r in results.items():
        print(
            f"{label:6} {r['n']:>4} {r['min_ms']:>8.3f} {r['median_ms']:>8.3f} "
            f"{r['p95_ms']:>8.3f}  {r['redactions']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
