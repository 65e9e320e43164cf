"""`stockade policy replay --config CANDIDATE.toml [--since --tenant --key] [--json]`: the
recorded calls through a candidate config's policy (calls/replay.py), what would change.
Run where the audit store is reachable: the records are read from the store the candidate
config names (its state_dir, audit.path or state.url), or from `--audit-config`'s."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from stockade.supervisor.calls.replay import FixedAlways, Replayer, ReplayReport, replay
from stockade.supervisor.config import load_config
from stockade.supervisor.errors import StockadeError
from stockade.supervisor.observe.audit import ScanQuery, scan_records
from stockade.supervisor.text import printable

NOW_PHRASE = {
    "refused": "now refused",
    "allowed": "now allowed",
    "approval": "now sent to approval",
}


def add_commands(sub: argparse._SubParsersAction[Any]) -> None:
    policy = sub.add_parser("policy", help="policy tools: replay the audit log against a config")
    policy_sub = policy.add_subparsers(dest="policy_command", required=True)
    run = policy_sub.add_parser(
        "replay", help="what a candidate config would have decided on the recorded calls"
    )
    run.add_argument("--config", type=Path, required=True, help="the candidate config (TOML)")
    run.add_argument(
        "--audit-config", type=Path,
        help="the config whose audit store holds the records (default: the candidate's)",
    )  # fmt: skip
    run.add_argument("--since", default="1d", help="e.g. 10m, 2h, 7d or an ISO time (default 1d)")
    run.add_argument("--tenant", help="only this tenant's records (default: every tenant's)")
    run.add_argument("--key", default="", help="only this sandbox key's records")
    run.add_argument("--json", action="store_true", help="the report as one JSON object")


def run(ns: argparse.Namespace) -> int:
    from stockade.supervisor.cli.audit_chain import open_store

    try:
        candidate = load_config(ns.config)
        source = load_config(ns.audit_config) if ns.audit_config else candidate
        query = ScanQuery(since=_since(ns.since), tenant=ns.tenant, sandbox_key=ns.key)
        with open_store(source) as (db, mark):
            approved = db.cursor().execute("SELECT tenant, command FROM approved").fetchall()
            recorded_tools = [tool.name for tool in source.custom_tools]
            replayer = Replayer(candidate, FixedAlways(approved), recorded_tools)
            report = replay(scan_records(db, mark, query), replayer, keep_ids=False)
    except StockadeError as exc:
        print(f"stockade policy replay: {exc}", file=sys.stderr)
        return 2
    if ns.json:
        print(json.dumps(report.as_json(), ensure_ascii=False, indent=2))
    else:
        print("\n".join(lines(report)))
    return 0


def lines(report: ReplayReport) -> list[str]:
    """The report for a terminal: counts, then each change with its rule and examples."""
    out = [f"replayed {report.replayed} call(s): {report.unchanged} unchanged"]
    if report.skipped:
        skipped = ", ".join(f"{n} {why}" for why, n in sorted(report.skipped.items()))
        out.append(f"skipped: {skipped}")
    for change in report.ordered():
        out.append(
            f"{NOW_PHRASE[change.now]} (was {change.was}): {change.count} call(s), "
            f"rule {change.rule}"
        )
        for e in change.examples:
            when = datetime.fromtimestamp(e.time, UTC).strftime("%Y-%m-%d %H:%M:%S")
            who = f"{e.tenant}/{e.sandbox_key}" if e.tenant else e.sandbox_key
            out.append(
                f"    #{e.id} {when} {printable(who)} {printable(e.tool)} "
                f"{printable(e.arguments_json[:120])}"
            )
    if not report.changes:
        out.append("no decision would change")
    return out


def _since(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        if text[-1:] in units and text[:-1].isdigit():
            return (
                datetime.now(UTC) - timedelta(seconds=int(text[:-1]) * units[text[-1]])
            ).timestamp()
        stamp = datetime.fromisoformat(text)
        return (stamp if stamp.tzinfo else stamp.astimezone()).timestamp()
    except (ValueError, OverflowError) as exc:
        raise StockadeError(f"--since: use 10m, 2h, 1d or an ISO time, not {text[:80]!r}") from exc
