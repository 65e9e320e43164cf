"""`make bench`: Stockade next to its peers, measured side by side in one run.

Per engine (Podman, Docker), on the same image and machine:
- the floor: a gRPC health check round trip to the supervisor;
- a warm `exec true` through Stockade's gRPC API (sync client, TCP 127.0.0.1), over the
  floor, and the supervisor's CPU time per such call (bench/cpu.py; its floor, grpc.aio's
  own cost per call: `python -m bench.grpc_floor`);
- the engine CLI's `exec C true` on a plain container of the same image;
- llm-sandbox's `execute_command("true")` on the same engine and image;
- cold start: the first call on a new key until its result;
- host memory per idle sandbox (PSS of its processes plus the engine's helper);
- the MCP front against gRPC: warm `exec true` through each front of one supervisor, in
  interleaved rounds, and what MCP costs more (bench/mcp_front.py; alone: `--only mcp`);
- the console's cost: warm `exec true` through a supervisor serving the console (nobody on
  it) against one without, in interleaved rounds (bench/console_cost.py; `--only console`);
- another tenant's warm gRPC `exec true` and E2B `commands.run("true")` alone, then while one
  tenant keeps up each attack on the HTTP fronts (bench/front_abuse.py; `--only front-abuse`).

`python -m bench --compare REV` (`make bench-compare BASE=REV`) measures only warm `exec true`
and the supervisor's CPU per call, REV's supervisor and this tree's side by side in one run
(bench/compare.py).

Figures are printed, and the last run is kept in bench/results.json. Nothing is
asserted: this is a measurement, not a test. Progress goes to stderr, results to stdout.
"""

from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results.json"
"""The last run's figures (`python -m bench`; `--compare` adds its own under "compare")."""
