"""The quarantine commands: `stockade quarantine list | show KEY | release KEY | destroy KEY
| add KEY [REASON]` and `stockade alarms watch` (docs/quarantine.md). Errors are the
client's: main prints them and exits 2."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import asdict
from datetime import datetime
from typing import Any

from stockade.client import Alarm, QuarantineInfo, Stockade
from stockade.supervisor.text import printable


def run(client: Stockade, ns: argparse.Namespace) -> int:
    if ns.command == "alarms":
        return _watch(client, ns)
    return _HANDLERS[ns.quarantine_command](client, ns)


def _list(client: Stockade, ns: argparse.Namespace) -> int:
    held = client.list_quarantines()
    if ns.json:
        print(json.dumps([_dict(q) for q in held], indent=2, ensure_ascii=False))
        return 0
    if not held:
        print("no sandbox is quarantined")
    for q in held:
        print(f"{printable(q.sandbox_key)}  since {_when(q.since)}  {printable(q.reason)}")
    return 0


def _show(client: Stockade, ns: argparse.Namespace) -> int:
    found = client.get_quarantine(ns.key)
    if ns.json:
        out = {
            "quarantine": _dict(found.quarantine),
            "audit": [_json(asdict(r)) for r in found.audit],
        }
        print(json.dumps(out, indent=2, ensure_ascii=False))
        return 0
    q = found.quarantine
    print(f"sandbox {printable(q.sandbox_key)} is quarantined since {_when(q.since)}")
    print(f"  reason:  {printable(q.reason)}")
    state = "frozen" if q.frozen else "not frozen"
    cut = f"network {q.network_cut} cut" if q.network_cut else "no network to cut"
    print(f"  state:   {state}, {cut}" + (f" ({printable(q.note)})" if q.note else ""))
    for alarm in q.alarms:
        print(f"  alarm:   {_alarm_line(alarm)}")
        if alarm.evidence:
            print(f"           evidence: {printable(alarm.evidence)}")
    print(f"  audit records around the alarms ({len(found.audit)}, oldest first):")
    for rec in found.audit:
        what = rec.policy_step or "allowed"
        args = printable(rec.arguments_json)[:200]
        error = f" {rec.error_code}" if rec.error_code else ""
        print(f"    {_when(rec.time)}  {printable(rec.tool)}  {printable(what)}{error}  {args}")
    return 0


def _release(client: Stockade, ns: argparse.Namespace) -> int:
    q = client.release_quarantine(ns.key)
    print(f"{printable(q.sandbox_key)}: released (was quarantined since {_when(q.since)})")
    return 0


def _destroy(client: Stockade, ns: argparse.Namespace) -> int:
    client.get_quarantine(ns.key)  # NotFound unless quarantined: destroy only what is
    removed = client.destroy_sandbox(ns.key, delete_workspace=ns.delete_workspace)
    kept = "workspace deleted" if ns.delete_workspace else "workspace kept"
    container = "container removed" if removed else "no container"
    print(f"{printable(ns.key)}: destroyed ({container}, {kept})")
    return 0


def _add(client: Stockade, ns: argparse.Namespace) -> int:
    q = client.quarantine_sandbox(ns.key, ns.reason)
    print(f"{printable(q.sandbox_key)}: quarantined since {_when(q.since)}")
    return 0


def _watch(client: Stockade, ns: argparse.Namespace) -> int:
    try:
        for alarm in client.watch_alarms():
            if ns.json:
                print(json.dumps(_json(asdict(alarm)), ensure_ascii=False), flush=True)
            else:
                print(_alarm_line(alarm), flush=True)
    except KeyboardInterrupt:
        pass
    return 0


_HANDLERS: dict[str, Callable[[Stockade, argparse.Namespace], int]] = {
    "list": _list,
    "show": _show,
    "release": _release,
    "destroy": _destroy,
    "add": _add,
}


def _alarm_line(alarm: Alarm) -> str:
    return (
        f"{_when(alarm.time)}  {printable(alarm.sandbox_key)}  {alarm.kind} at "
        f"{printable(alarm.where)}: {printable(alarm.detail)}"
    )


def _when(moment: datetime | None) -> str:
    return moment.astimezone().strftime("%Y-%m-%d %H:%M:%S") if moment else "?"


def _dict(q: QuarantineInfo) -> dict[str, Any]:
    out: dict[str, Any] = _json(asdict(q))
    return out


def _json(value: Any) -> Any:
    """Times in ISO 8601, the rest as it is."""
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def add_commands(sub: argparse._SubParsersAction[Any], client: argparse.ArgumentParser) -> None:
    """quarantine list|show|release|destroy|add, and alarms watch."""
    quarantine = sub.add_parser("quarantine", help="quarantined sandboxes and their evidence")
    q_sub = quarantine.add_subparsers(dest="quarantine_command", required=True)
    listing = q_sub.add_parser("list", parents=[client], help="the quarantined sandboxes")
    listing.add_argument("--json", action="store_true")
    show = q_sub.add_parser("show", parents=[client], help="a quarantine's evidence")
    show.add_argument("--json", action="store_true")
    show.add_argument("key")
    release = q_sub.add_parser(
        "release", parents=[client], help="network back, thawed, calls served again"
    )
    release.add_argument("key")
    destroy = q_sub.add_parser(
        "destroy", parents=[client], help="remove a quarantined sandbox's container"
    )
    destroy.add_argument("--delete-workspace", action="store_true")
    destroy.add_argument("key")
    add = q_sub.add_parser("add", parents=[client], help="quarantine a sandbox by hand")
    add.add_argument("key")
    add.add_argument("reason", nargs="?", default="")
    alarms = sub.add_parser("alarms", help="alarms as they sound")
    a_sub = alarms.add_subparsers(dest="alarms_command", required=True)
    watch = a_sub.add_parser("watch", parents=[client], help="print each alarm as it sounds")
    watch.add_argument("--json", action="store_true", help="one JSON object per line")
