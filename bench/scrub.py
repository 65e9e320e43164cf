"""`python -m bench.scrub`: how long the credential scrubber takes on 4 KiB and 1 MiB of
typical tool output (ls, git log, pip, ps, a traceback, a lockfile, JSON) with a few
secrets in it, and two configured literal secrets, all formats on; and its recall and false
positives over the corpora in tests/corpora. No container engine needed."""

from __future__ import annotations

import hashlib
import json
import sys
import uuid
from functools import partial
from typing import Any

from bench.timing import time_calls
from stockade.supervisor.policy.scrub.formats import FORMATS
from stockade.supervisor.policy.scrub.scrubber import Scrubber
from tests.corpora.measure import MAX_FALSE_POSITIVE_RATE, MIN_RECALL, measure

TARGET_1MIB_MS = 3.0
TARGET_4KIB_MS = 0.02

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


def run_scrub_bench(runs_4k: int = 2000, runs_1m: int = 30) -> dict[str, Any]:
    """Scrubber.scrub timed on 4 KiB (2000 runs) and 1 MiB (30 runs), each after a warm-up;
    recall and false positives over the corpora."""
    scrubber = Scrubber(CONFIGURED)
    results: dict[str, Any] = {"formats": len(FORMATS)}
    for label, size, n in (("4KiB", 4096, runs_4k), ("1MiB", 1 << 20, runs_1m)):
        text = sample_text(size)
        figures = time_calls(partial(scrubber.scrub, text), n, warmup=max(n // 10, 3))
        results[label] = {**figures, "redactions": scrubber.scrub(text)[1]}
    corpora = measure(Scrubber(CONFIGURED))
    results["corpora"] = {k: v for k, v in corpora.items() if k not in ("missed", "changed")}
    return results


def section(results: dict[str, Any]) -> list[str]:
    """The printed lines: times, corpora figures, and each against its target."""
    lines = [
        f"Scrubber.scrub, {results['formats']} formats and 2 configured secrets (ms)",
        f"{'text':6} {'n':>5} {'min':>8} {'median':>8} {'p95':>8}  redactions",
    ]
    for label in ("4KiB", "1MiB"):
        r = results[label]
        lines.append(
            f"{label:6} {r['n']:>5} {r['min_ms']:>8.3f} {r['median_ms']:>8.3f} "
            f"{r['p95_ms']:>8.3f}  {r['redactions']}"
        )
    c = results["corpora"]
    small, big = results["4KiB"]["median_ms"], results["1MiB"]["median_ms"]
    return [
        *lines,
        f"corpora: {c['credentials']} fake credentials ({c['formats']} kinds), "
        f"{c['ordinary_lines']} ordinary lines",
        f"  scrub 4 KiB median {small:.3f} ms   target <= {TARGET_4KIB_MS} ms   "
        f"{_met(small <= TARGET_4KIB_MS)}",
        f"  scrub 1 MiB median {big:.2f} ms   target <= {TARGET_1MIB_MS} ms   "
        f"{_met(big <= TARGET_1MIB_MS)}",
        f"  recall {c['recall']:.2%}   target >= {MIN_RECALL:.1%}   "
        f"{_met(c['recall'] >= MIN_RECALL)}",
        f"  false positives {c['false_positive_lines']} lines ({c['false_positive_rate']:.3%})"
        f"   target <= {MAX_FALSE_POSITIVE_RATE:.1%}   "
        f"{_met(c['false_positive_rate'] <= MAX_FALSE_POSITIVE_RATE)}",
    ]


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def main() -> int:
    print("\n".join(section(run_scrub_bench())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
