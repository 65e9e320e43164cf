"""Readable renderings of tool results, and the caps that keep them bounded."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def cap_text(text: str, max_bytes: int) -> tuple[str, bool]:
    """Keep the head and the tail within max_bytes of UTF-8, with a marker between."""
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) <= max_bytes:
        return text, False
    budget = max_bytes - len(_MARKER.format(len(raw)))  # the count has at most these digits
    if budget <= 0:  # no room for the marker: the head only
        return raw[:max_bytes].decode("utf-8", "ignore"), True
    head = raw[: budget // 2].decode("utf-8", "ignore")
    tail = raw[len(raw) - budget // 2 :].decode("utf-8", "ignore")
    omitted = len(raw) - len(head.encode()) - len(tail.encode())
    return head + _MARKER.format(omitted) + tail, True


_MARKER = "\n\n[... {} bytes omitted ...]\n\n"


def _size(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def _exec(d: dict[str, Any]) -> str:
    parts = [str(d.get("stdout", ""))]
    if d.get("stderr"):
        parts.append(f"[stderr]\n{d['stderr']}")
    for stream in ("stdout", "stderr"):
        if d.get(f"{stream}_truncated"):
            parts.append(
                f"[{stream} cut: kept the first part of {_size(d.get(f'{stream}_bytes', 0))}]"
            )
    if d.get("timed_out"):
        parts.append(f"[timed out after {d.get('duration_ms', 0)} ms; process group killed]")
    elif d.get("oom_killed"):
        parts.append(f"[killed: out of memory, exit code {d.get('exit_code')}]")
    elif d.get("signal"):
        parts.append(f"[killed by {d['signal']}, exit code {d.get('exit_code')}]")
    elif d.get("exit_code"):
        parts.append(f"[exit code {d['exit_code']}]")
    return "\n".join(p for p in parts if p) or "[no output]"


def _list(d: dict[str, Any]) -> str:
    lines = [
        f"{e['name']}/" if e.get("is_dir") else f"{e['name']}  ({e.get('size', 0)} bytes)"
        for e in d.get("entries", [])
    ]
    return "\n".join(lines) or "[empty directory]"


def _search(d: dict[str, Any]) -> str:
    lines = [f"{m['file']}:{m['line']}: {m['text']}" for m in d.get("matches", [])]
    return "\n".join(lines) or "[no matches]"


def _process_state(d: dict[str, Any]) -> str:
    if d.get("state") != "exited":
        return "running"
    killed = f" by {d['signal']}" if d.get("signal") else ""
    return f"exited{killed}, exit code {d.get('exit_code')}"


def _process_list(d: dict[str, Any]) -> str:
    lines = [
        f"{p['id']}  {p.get('name') or '-'}  pid {p.get('pid')}  {_process_state(p)}  "
        f"{_size(p.get('output_bytes', 0))} output  $ {p.get('command', '')}"
        for p in d["processes"]
    ]
    return "\n".join(lines) or "[no processes]"


def _process_log(d: dict[str, Any]) -> str:
    parts = [str(d.get("data", ""))]
    if d.get("dropped"):
        parts.append(f"[{d['dropped']} bytes dropped: the log keeps only the latest output]")
    if d.get("state") == "exited":
        parts.append(f"[process {_process_state(d)}]")
    parts.append(f"[next offset {d['next_offset']}]")
    return "\n".join(p for p in parts if p)


def _process(d: dict[str, Any]) -> str:
    """One renderer for every action of the process tool, told apart by their fields."""
    if "processes" in d:
        return _process_list(d)
    if "next_offset" in d:
        return _process_log(d)
    ident = d["id"]
    if "started_at" in d:
        named = f" '{d['name']}'" if d.get("name") else ""
        tty = " on a terminal" if d.get("pty") else ""
        return f"Started process {ident}{named} (pid {d.get('pid')}){tty}: {d.get('command', '')}"
    if "written" in d:
        closed = "; stdin closed" if d.get("eof") else ""
        return f"Wrote {d['written']} bytes to the stdin of {ident}{closed}"
    if "cols" in d:
        return f"Resized the terminal of {ident} to {d['cols']}x{d['rows']}"
    if d.get("removed"):
        return f"Removed process {ident}"
    if d.get("detached"):
        return f"Detached from process {ident} after {_size(d.get('input_bytes', 0))} of input"
    if "output_bytes" in d:
        return f"Process {ident}: {_process_state(d)}, {_size(d['output_bytes'])} output"
    return f"Sent {d.get('signal')} to process {ident}: now {_process_state(d)}"


def _patch(d: dict[str, Any]) -> str:
    lines = [f"{tag} {path}" for key, tag in _PATCH_TAGS for path in d.get(key, [])]
    lines += [f"R {m['from']} -> {m['to']}" for m in d.get("moved", [])]
    return "\n".join(lines) or "[no changes]"


_PATCH_TAGS = (("added", "A"), ("updated", "M"), ("deleted", "D"))

_RENDERERS: dict[str, Callable[[dict[str, Any]], str]] = {
    "exec": _exec,
    "process": _process,
    "read_file": lambda d: str(d.get("content", "")),
    "write_file": lambda d: f"Wrote {d.get('bytes_written', 0)} bytes to {d.get('path', '')}",
    "edit_file": lambda d: f"Edited {d.get('path', '')}",
    "apply_patch": _patch,
    "list_files": _list,
    "glob": lambda d: "\n".join(d.get("matches", [])) or "[no matches]",
    "search": _search,
}


def render(tool: str, data: dict[str, Any]) -> str:
    try:
        text = _RENDERERS[tool](data)
    except (KeyError, TypeError, AttributeError):
        return str(data)
    if data.get("truncated"):
        text += "\n[result cut: more entries exist]"
    return text
