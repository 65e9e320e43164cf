"""`python -m bench --smoke` on each engine: every section of `make bench` with tiny sizes
(bench/smoke.py), so that `make bench` cannot break unseen. The run must end 0 (each section
produced figures) and print every section's table; no figure is asserted: speed belongs to
the bench. Its duration is printed (it adds to `make test`'s)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(900)
ROOT = Path(__file__).resolve().parents[2]
TABLES = (
    "== host-side policy",
    "== brokered credentials",
    "== audit log size",
    "== audit hash chain",
    "== HTTP listener",
    "== {engine} ==",
    "== {engine}: cold start by stage",
    "== {engine}: load over 3 keys",
    "== {engine}: density",
    "== {engine}: a quiet sandbox's exec true while another abuses",
    "== {engine}: another tenant's warm calls while one attacks the HTTP fronts",
    "== {engine}: MCP against gRPC",
    "== {engine}: E2B commands.run",
    "== {engine}: warm exec true, console off against on",
    "== {engine}: sandbox snapshots",
    "== {engine}: write_file with and without a checkpoint",
    "== side by side",
)
"""How each section's table begins."""


def test_every_section_produces_figures(engine: str) -> None:
    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--engine", engine],
        cwd=ROOT, capture_output=True, text=True, timeout=850, check=False,
    )  # fmt: skip
    print(f"bench --smoke on {engine}: {time.monotonic() - started:.0f} s")
    assert run.returncode == 0, f"{run.stdout[-6000:]}\n{run.stderr[-6000:]}"
    assert "section(s) without figures" in run.stdout
    heads = [line for line in run.stdout.splitlines() if line.startswith("== ")]
    missing = [t for t in TABLES if not any(h.startswith(t.format(engine=engine)) for h in heads)]
    assert not missing, run.stdout
