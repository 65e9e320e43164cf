"""Printing the results: a header with the machine, one table per engine, ratios against
the targets, and a side-by-side summary. Targets are shown, never asserted."""

from __future__ import annotations

from typing import Any

TARGET_WARM_MS = 5.0
TARGET_CLI_RATIO = 15.0
TARGET_LLM_RATIO = 8.0
TARGET_SESSION_EXTRA_MS = 0.5
TARGET_CPU_US = 500.0
TARGET_WARM_OVER_HEALTH = 3.0
"""Issue 30: the supervisor's CPU per warm `exec true`, and that call over the health round
trip of the same run."""

ROWS = (
    ("health", "gRPC health check (floor)"),
    ("stockade_warm", "Stockade exec true, warm"),
    ("session_exec", "exec true in a shell session"),
    ("interact_line", "Stockade Interact, line echo"),
    ("engine_cli", "{engine} exec C true (CLI)"),
    ("llm_sandbox", "llm-sandbox execute_command"),
    ("cold_start", "Stockade cold start, 1st call"),
    ("cold_start_pool", "cold start, warm pool of 2"),
    ("stockade_warm_no_userns", "exec true, warm, no user namespace"),
    ("cold_start_no_userns", "cold start, no user namespace"),
)
PODMAN_ONLY = frozenset({"stockade_warm_no_userns", "cold_start_no_userns"})
"""Rows of the cost of Podman's default user namespace (Docker has none to compare)."""


def ratios(results: dict[str, Any]) -> dict[str, float | None]:
    """Peer median ÷ Stockade warm median."""
    base = results.get("stockade_warm", {}).get("median_ms")

    def over(name: str) -> float | None:
        peer = results.get(name, {}).get("median_ms")
        return round(peer / base, 1) if peer and base else None

    return {
        "engine_cli_over_stockade": over("engine_cli"),
        "llm_sandbox_over_stockade": over("llm_sandbox"),
    }


def header(machine: dict[str, Any], settings: dict[str, Any]) -> str:
    lines = [
        "Stockade benchmark",
        f"machine: {machine['cores']} cores ({machine['cpu']}), {machine['ram_gib']} GiB RAM, "
        f"kernel {machine['kernel']}, {machine['os']}, cgroup {machine['cgroup']}",
        f"python {machine['python']}, grpcio {machine['grpcio']}, "
        f"llm-sandbox {machine['llm-sandbox']}",
    ]
    if "podman" in machine:
        p = machine["podman"]
        lines.append(f"podman {p['version']} (runtime {p['runtime']}, {p['cgroup_manager']})")
    if "docker" in machine:
        d = machine["docker"]
        lines.append(f"docker engine {d['version']} (runtime {d['runtime']}), CLI {d['client']}")
    lines.append(
        f"settings: warm n={settings['n']} (+{settings['warmup']} warm-up), "
        f"cold n={settings['cold']}, idle sandboxes={settings['idle']}"
    )
    return "\n".join(lines)


def engine_section(engine: str, results: dict[str, Any]) -> str:
    lines = [f"== {engine} ==", f"{'':34}{'n':>5}{'min':>10}{'median':>10}{'p95':>10}   ms"]
    for name, label in ROWS:
        if name in PODMAN_ONLY and name not in results:
            continue
        lines.append(_row(label.format(engine=engine), results.get(name, {"error": "not run"})))
    lines.append(_memory(engine, results.get("idle_memory", {"error": "not run"})))
    lines.append(_floor(results.get("python_floor", {"error": "not run"}), results))
    lines += _egress(results.get("egress", {"error": "not run"}))
    lines.append(_load(results.get("load", {"error": "not run"})))
    lines += _targets(engine, results)
    return "\n".join(lines)


def _row(label: str, r: dict[str, Any]) -> str:
    if "error" in r:
        return f"{label:34}  n/a: {r['error']}"
    row = f"{label:34}{r['n']:>5}{r['min_ms']:>10.2f}{r['median_ms']:>10.2f}{r['p95_ms']:>10.2f}"
    if "from_pool" in r:
        row += f"   ({r['from_pool']} of {r.get('n_pooled', r['n'])} from the pool)"
    if "conmon_left_behind" in r:
        row += f"   ({r['conmon_left_behind']} exec conmons still alive)"
    return row


def session_section(engine: str, r: dict[str, Any]) -> str:
    """The shell session's cost: a warm exec in a session beside a plain one."""
    if "error" in r:
        return f"{engine}: exec in a shell session: n/a: {r['error']}"
    extra = r["extra_median_ms"]
    verdict = "met" if extra <= TARGET_SESSION_EXTRA_MS else "MISSED"
    return "\n".join(
        [
            f"== {engine}: exec true in a shell session beside a plain one ==",
            _row("plain exec (bash)", r["plain"]),
            _row("in a session", r),
            *([_row("plain exec under sh (dash)", r["sh"])] if "sh" in r else []),
            f"  session over plain (medians): {extra:+.2f} ms   target "
            f"<= {TARGET_SESSION_EXTRA_MS:g} ms {verdict}",
        ]
    )


def _egress(e: dict[str, Any]) -> list[str]:
    if "error" in e:
        return [f"{'egress':34}  n/a: {e['error']}"]
    cap = e["cap_kbit"] / 8 / 1000
    return [
        _row("egress: small GET via the proxy", e["small_get"]),
        f"egress cap {cap:.1f} MB/s: download {e['download_bytes_per_s'] / 1e6:.2f} MB/s "
        f"({e['download_over_cap']:.2f} of the cap), upload {e['upload_bytes_per_s'] / 1e6:.2f} "
        f"MB/s ({e['upload_over_cap']:.2f})",
    ]


TARGET_IDLE_MIB = 10.0
"""Issue 30: agent + init of an idle sandbox, PSS."""


def _floor(f: dict[str, Any], results: dict[str, Any]) -> str:
    """The Python floor, and the idle sandbox's agent + init against issue 30's target."""
    inside = results.get("idle_memory", {}).get("pss_inside_mib")
    verdict = "n/a" if inside is None else "met" if inside <= TARGET_IDLE_MIB else "NOT met"
    target = f"agent+init {_mib(inside)}   target <= {TARGET_IDLE_MIB:g} MiB PSS   {verdict}"
    label = "floor: an idle python3 alone"
    if "error" in f:
        return f"{label:34}  n/a: {f['error']}\n  {target}"
    return (
        f"{label:34}  {f['pss_mib']:.1f} MiB PSS, USS {f['uss_mib']:.1f}, RSS {f['rss_mib']:.1f}"
        f"\n  {target}"
    )


def _mib(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} MiB"


def _memory(engine: str, m: dict[str, Any]) -> str:
    if "error" in m:
        return f"{'memory per idle sandbox':34}  n/a: {m['error']}"
    helper = "conmon" if engine == "podman" else "containerd-shim"

    def split(kind: str) -> str:
        return f"{m[f'{kind}_inside_mib']:.1f} + {m[f'{kind}_helper_mib']:.1f}"

    return (
        f"memory per idle sandbox ({m['sandboxes']}): {m['pss_mib']:.1f} MiB PSS = "
        f"agent+init {m['pss_inside_mib']:.1f} + {helper} {m['pss_helper_mib']:.1f}\n"
        f"{'':31}USS {m['uss_mib']:.1f} = {split('uss')}, RSS {m['rss_mib']:.1f} = {split('rss')}"
    )


def load_section(engine: str, r: dict[str, Any]) -> str:
    """A load run of its own (`--load-wide KEYS`): its lines under a heading."""
    keys = f"over {r['keys']} keys" if "keys" in r else "over many keys"
    return f"== {engine}: load {keys} ==\n{_load(r)}"


def _load(r: dict[str, Any]) -> str:
    if "error" in r:
        return f"{'load (mixed calls, many keys)':34}  n/a: {r['error']}"
    head = (
        f"load: {r['keys']} keys x {r['calls_per_key']} mixed calls, {r['calls']} calls in "
        f"{r['seconds']:.1f} s = {r['throughput_per_s']:.0f} calls/s, {r['errors']} errors"
    )
    if not r["calls"]:
        return head
    return (
        f"{head}\n{'':6}latency ms: p50 {r['median_ms']:.2f}, p95 {r['p95_ms']:.2f}, "
        f"p99 {r['p99_ms']:.2f}, mean {r['mean_ms']:.2f} "
        f"(sandboxes made first in {r['setup_seconds']:.1f} s)"
    )


def _targets(engine: str, results: dict[str, Any]) -> list[str]:
    warm = results.get("stockade_warm", {}).get("median_ms")
    extra = results.get("session_exec", {}).get("extra_median_ms")
    cli_ratio = results.get("ratios", {}).get("engine_cli_over_stockade")
    llm_ratio = results.get("ratios", {}).get("llm_sandbox_over_stockade")
    health = results.get("health", {}).get("median_ms")
    over = round(warm / health, 2) if warm and health else None
    cpu = results.get("supervisor_cpu", {}).get("cpu_us_per_call")
    return [
        _target("Stockade warm median", _ms(warm), f"<= {TARGET_WARM_MS:g} ms",
                None if warm is None else warm <= TARGET_WARM_MS),
        _target("warm ÷ health round trip", _x(over), f"<= {TARGET_WARM_OVER_HEALTH:g}x",
                None if over is None else over <= TARGET_WARM_OVER_HEALTH),
        _target("supervisor CPU per warm call", _us(cpu), f"<= {TARGET_CPU_US:g} us",
                None if cpu is None else cpu <= TARGET_CPU_US),
        _target("session over plain exec", _ms(extra), f"<= {TARGET_SESSION_EXTRA_MS:g} ms",
                None if extra is None else extra <= TARGET_SESSION_EXTRA_MS),
        _target(f"{engine} exec CLI ÷ Stockade", _x(cli_ratio), f">= {TARGET_CLI_RATIO:g}x",
                None if cli_ratio is None else cli_ratio >= TARGET_CLI_RATIO),
        _target("llm-sandbox ÷ Stockade", _x(llm_ratio), f">= {TARGET_LLM_RATIO:g}x",
                None if llm_ratio is None else llm_ratio >= TARGET_LLM_RATIO),
    ]  # fmt: skip


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} ms"


def _us(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f} us"


def _x(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}x"


def _target(label: str, shown: str, target: str, met: bool | None) -> str:
    verdict = "n/a" if met is None else "met" if met else "MISSED"
    return f"  {label:32}{shown:>12}   target {target:10} {verdict}"


def summary(engines: dict[str, dict[str, Any]]) -> str:
    names = list(engines)
    lines = ["== side by side (medians, ms) ==", f"{'':34}" + "".join(f"{n:>12}" for n in names)]
    for name, label in ROWS:
        cells = [engines[e].get(name, {}).get("median_ms") for e in names]
        lines.append(
            f"{label.format(engine='engine'):34}" + "".join(_cell(c, ".2f") for c in cells)
        )
    for key, label in (("throughput_per_s", "load: calls/s"), ("p95_ms", "load: p95 ms")):
        cells = [engines[e].get("load", {}).get(key) for e in names]
        lines.append(f"{label:34}" + "".join(_cell(c, ".1f") for c in cells))
    for front, label in (
        ("mcp", "MCP - gRPC, SDK default (ms)"),
        ("mcp_session", "MCP - gRPC, session (ms)"),
    ):
        extra = [_mcp_extra(engines[e].get("mcp", {}), front) for e in names]
        lines.append(f"{label:34}" + "".join(_cell(c, ".2f") for c in extra))
    cpu = [engines[e].get("supervisor_cpu", {}).get("cpu_us_per_call") for e in names]
    lines.append(f"{'supervisor CPU per warm call, us':34}" + "".join(_cell(c, ".0f") for c in cpu))
    pss = [engines[e].get("idle_memory", {}).get("pss_mib") for e in names]
    lines.append(f"{'idle sandbox, MiB PSS':34}" + "".join(_cell(c, ".1f") for c in pss))
    for key, label in (
        ("engine_cli_over_stockade", "engine CLI ÷ Stockade (x)"),
        ("llm_sandbox_over_stockade", "llm-sandbox ÷ Stockade (x)"),
    ):
        cells = [engines[e].get("ratios", {}).get(key) for e in names]
        lines.append(f"{label:34}" + "".join(_cell(c, ".1f") for c in cells))
    return "\n".join(lines)


def _mcp_extra(result: dict[str, Any], front: str) -> float | None:
    """`front` - gRPC of the pooled warm medians (bench/mcp_front.py), if measured."""
    extra = result.get(f"{front}_minus_grpc", {}).get("median_ms", {}).get("pooled")
    return extra if isinstance(extra, float | int) else None


def _cell(value: float | None, spec: str) -> str:
    return f"{'n/a':>12}" if value is None else f"{value:>12{spec}}"
