"""Another tenant's latency while one attacks the HTTP fronts (issue 26, "Done when" 1: "a
normal client of another tenant meanwhile gets its answers with p50 within 2x of an idle
server").

One `stockade serve` with the gRPC, MCP, E2B and console fronts on and two token tenants:
"attacker" and "quiet". The quiet tenant's warm gRPC `exec true` and its warm E2B SDK
`commands.run("true")` are timed alone first; then, for each attack, while the attacker keeps
it up in a loop, both are timed again. The attacker is a process of its own (spawned, so its
client work never holds this process's interpreter lock while a call is timed), its threads
started RAMP_S before the timing and stopped after.
The attacks are those of the integration tests (bench/hostile.py holds their clients):
tests/integration/test_http_hostile.py, test_e2b_bodies.py and test_tenant_caps.py, and the
unauthenticated 128 MiB header value of tests/unit/test_http_listener.py. Reported per attack
and side: the median, its ratio to the idle median and "met" / "NOT met" against 2x, and what
the attacker's requests got (their statuses, counted).

Part of every `make bench` (`engines.<engine>.front_abuse` in bench/results.json), or alone:
`python -m bench --only front-abuse [--engine E] [--n N]`.
"""

from __future__ import annotations

import functools
import gzip
import multiprocessing
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
from e2b import Sandbox
from e2b.exceptions import RateLimitException, SandboxException

from bench import hostile
from bench.console_cost import tenants_file
from bench.engines import bring_up
from bench.mcp_front import run_alone
from bench.served import free_port, served
from bench.stockade_runs import destroy, exec_true
from bench.timing import Result, progress, time_calls
from stockade.client import Stockade
from tests.unit.test_tenant_caps import INIT, mcp_headers

TARGET_RATIO = 2.0
RAMP_S = 1.0
"""Time an attack gets to build up before the quiet tenant is timed."""
HOLD_S = 5.0
"""How long the held connections stay open before they are opened anew."""
JOIN_S = 120.0
START_S = 120.0
SANDBOXES = 2
"""e2b.max_sandboxes_per_tenant of the supervisor: the create flood is refused past it."""
SESSIONS = 20
"""mcp.max_sessions_per_tenant: the MCP session flood is refused past it."""
METADATA = 65536
"""e2b.max_metadata_bytes (its default); the metadata attack sends one byte more."""
KEY = "bench-front-quiet"
UPLOAD = "/home/user/attacked.bin"


@dataclass
class Attacker:
    """What the attacking tenant holds: its token, the fronts' addresses, an E2B sandbox of
    its own (the target of the body attacks) and the sandboxes its create flood got."""

    token: str
    addresses: dict[str, str]
    """"mcp", "e2b", "console": host:port."""
    sandbox: Sandbox
    stop: threading.Event = field(default_factory=threading.Event)
    made: list[Sandbox] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{self.addresses['e2b']}"

    def opts(self) -> dict[str, Any]:
        return {"api_url": self.url, "sandbox_url": self.url, "api_key": self.token}

    def envd(self) -> httpx.Client:
        return hostile.envd_client(self.url, self.sandbox)


def held(a: Attacker) -> str:
    """1,000 idle and 200 slow-header connections to each HTTP port, held HOLD_S."""
    with hostile.held_connections(a.addresses) as socks:
        a.stop.wait(HOLD_S)
        return f"{len(socks)} held"


def huge_header(a: Attacker) -> str:
    return str(hostile.huge_header(a.addresses["e2b"]))


@functools.cache
def bomb() -> bytes:
    return hostile.bomb()


def gzip_bomb(a: Attacker) -> str:
    with a.envd() as client:
        return str(hostile.upload(client, UPLOAD, bomb(), "gzip").status_code)


@functools.cache
def truncated() -> bytes:
    """200 KiB of random bytes as gzip, cut to its first third (as the test sends it)."""
    whole = gzip.compress(os.urandom(200 << 10))
    return whole[: len(whole) // 3]


def truncated_gzip(a: Attacker) -> str:
    with a.envd() as client:
        return str(hostile.upload(client, UPLOAD, truncated(), "gzip").status_code)


@functools.cache
def envelope() -> bytes:
    return hostile.start_envelope()


def big_envelope(a: Attacker) -> str:
    with a.envd() as client:
        r = client.post("/process.Process/Start", content=envelope(), headers=hostile.CONNECT_JSON)
    return "resource_exhausted" if b"resource_exhausted" in r.content else str(r.status_code)


def multipart_300mb(a: Attacker) -> str:
    """One 300 MB multipart part, streamed (the front streams it into the sandbox)."""

    def body() -> Iterator[bytes]:
        yield b'--b0und\r\nContent-Disposition: form-data; name="file"; filename="big.bin"\r\n\r\n'
        block = bytes(hostile.MiB)
        for _ in range(300):
            yield block
        yield b"\r\n--b0und--\r\n"

    headers = {"content-type": "multipart/form-data; boundary=b0und"}
    with a.envd() as client:
        return str(client.post("/files", content=body(), headers=headers).status_code)


def deep_json(a: Attacker) -> str:
    with a.envd() as client:
        json = {"content-type": "application/json"}
        envd = client.post("/filesystem.Filesystem/Stat", content=hostile.DEEP_JSON, headers=json)
    control = httpx.post(
        f"{a.url}/sandboxes", content=hostile.DEEP_JSON, headers={"X-API-KEY": a.token}, timeout=60
    )
    return f"{envd.status_code}/{control.status_code}"


def mcp_sessions(a: Attacker) -> str:
    """An MCP initialize; past mcp.max_sessions_per_tenant each is 429 (the opened ones stay
    open)."""
    url = f"http://{a.addresses['mcp']}/mcp"
    return str(httpx.post(url, json=INIT, headers=mcp_headers(a.token), timeout=60).status_code)


def e2b_creates(a: Attacker) -> str:
    """An E2B sandbox create; past e2b.max_sandboxes_per_tenant each is 429."""
    try:
        a.made.append(Sandbox.create(**a.opts()))
    except RateLimitException:
        return "429"
    return "created"


def metadata(a: Attacker) -> str:
    """A create with one byte more metadata than e2b.max_metadata_bytes: 400."""
    try:
        a.made.append(Sandbox.create(metadata={"big": "x" * METADATA}, **a.opts()))
    except SandboxException as exc:
        return str(exc).split(":", 1)[0]
    return "created"


@dataclass(frozen=True)
class Attack:
    round: Callable[[Attacker], str]
    threads: int = 1
    prepare: Callable[[], object] = lambda: None
    """Makes the attack's body before its threads start."""


ATTACKS = {
    "1,000 idle + 200 slow-header conns/port": Attack(held),
    "128 MiB header value, unauthenticated": Attack(huge_header),
    "gzip bomb to /files, six at once": Attack(gzip_bomb, 6, bomb),
    "truncated gzip to /files": Attack(truncated_gzip, prepare=truncated),
    "60 MB Connect Start envelope": Attack(big_envelope, prepare=envelope),
    "300 MB multipart part to /files": Attack(multipart_300mb),
    "JSON nested 100,000 deep": Attack(deep_json),
    "MCP session flood past the cap": Attack(mcp_sessions, 8),
    "E2B creates past the cap": Attack(e2b_creates, 4),
    "E2B metadata past its size": Attack(metadata, 4),
}


def config(addresses: dict[str, str]) -> str:
    return (
        f'[e2b]\nlisten = "{addresses["e2b"]}"\nmax_sandboxes_per_tenant = {SANDBOXES}\n'
        f'[mcp]\nlisten = "{addresses["mcp"]}"\nmax_sessions_per_tenant = {SESSIONS}\n'
        f'[console]\nlisten = "{addresses["console"]}"\noperators = ["quiet"]\n'
    )


@dataclass
class Quiet:
    """The quiet tenant's two callers: gRPC `exec true`, E2B `commands.run("true")`."""

    client: Stockade
    sandbox: Sandbox

    def grpc(self) -> None:
        exec_true(self.client, KEY)

    def e2b(self) -> None:
        result = self.sandbox.commands.run("true")
        if result.exit_code != 0:
            raise RuntimeError(f"E2B commands.run('true') failed: {result}")

    def timed(self, n: int, warmup: int) -> dict[str, Result]:
        return {"grpc": time_calls(self.grpc, n, warmup), "e2b": time_calls(self.e2b, n, warmup)}


def attack_loop(
    name: str, token: str, addresses: dict[str, str], sandbox_id: str, events: Any, got: Any
) -> None:
    """The attacker's process: `name` kept up in its threads from when `events[0]` is set
    until `events[1]` is (process Events); what its requests got is put on `got`, and the
    sandboxes it made are killed."""
    started, stop = events
    hostile.enough_open_files(3 * (hostile.IDLE + hostile.SLOW) + 500)
    url = f"http://{addresses['e2b']}"
    box = Sandbox.connect(sandbox_id, api_url=url, sandbox_url=url, api_key=token)
    attacker = Attacker(token, addresses, box)
    attack = ATTACKS[name]
    attack.prepare()
    answers: Counter[str] = Counter()
    lock = threading.Lock()

    def loop() -> None:
        while not attacker.stop.is_set():
            try:
                answer = attack.round(attacker)
            except Exception as exc:  # the attack goes on; what it met is counted
                answer = type(exc).__name__
            with lock:
                answers[answer] += 1

    threads = [threading.Thread(target=loop, daemon=True) for _ in range(attack.threads)]
    for thread in threads:
        thread.start()
    started.set()
    stop.wait()
    attacker.stop.set()
    for thread in threads:
        thread.join(JOIN_S)
    for made in attacker.made:  # a create flood's sandboxes: the next attack starts anew
        made.kill()
    got.put(dict(answers.most_common()))


def during(quiet: Quiet, attacker: Attacker, name: str, n: int) -> dict[str, Any]:
    """The quiet tenant timed while attack `name` runs in a process of its own (its client
    work never shares this process's interpreter lock with the timed calls); what the
    attack's requests got."""
    context = multiprocessing.get_context("spawn")
    started, stop, got = context.Event(), context.Event(), context.Queue()
    events = (started, stop)
    args = (name, attacker.token, attacker.addresses, attacker.sandbox.sandbox_id, events, got)
    child = context.Process(target=attack_loop, args=args, daemon=True)
    child.start()
    try:
        deadline = time.monotonic() + START_S
        while not started.wait(0.2):
            if not child.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the attacker's process did not start {name!r}")
        time.sleep(RAMP_S)
        timed = quiet.timed(n, 0)
    finally:
        stop.set()
        child.join(JOIN_S)
        if child.is_alive():
            child.kill()
    if child.exitcode != 0:
        raise RuntimeError(f"the attacker's process of {name!r} ended with {child.exitcode}")
    answers = got.get(timeout=10)
    return {**timed, "answers": answers}


def ratios(alone: dict[str, Result], attacked: dict[str, Any]) -> dict[str, Any]:
    for side in ("grpc", "e2b"):
        ratio = attacked[side]["median_ms"] / alone[side]["median_ms"]
        attacked[side]["ratio"] = round(ratio, 2)
        attacked[side]["met"] = ratio <= TARGET_RATIO
    return attacked


def measure(
    addresses: dict[str, str],
    target: str,
    tokens: dict[str, str],
    n: int,
    warmup: int,
    attacks: Sequence[str],
) -> dict[str, Any]:
    url = f"http://{addresses['e2b']}"
    opts: dict[str, Any] = {"api_url": url, "sandbox_url": url, "timeout": 3600}
    quiet_box = Sandbox.create(api_key=tokens["quiet"], **opts)
    attacker = Attacker(
        tokens["attacker"], addresses, Sandbox.create(api_key=tokens["attacker"], **opts)
    )
    try:
        with Stockade(target, token=tokens["quiet"]) as client:
            quiet = Quiet(client, quiet_box)
            try:
                alone = quiet.timed(n, max(warmup, 1))
                results = {}
                for name in attacks:
                    progress(f"  while: {name}")
                    results[name] = ratios(alone, during(quiet, attacker, name, n))
            finally:
                destroy(client, KEY)
    finally:
        for box in (quiet_box, attacker.sandbox):
            box.kill()
    return {"alone": alone, "attacks": results}


def measure_engine(
    engine: str, n: int, warmup: int, attacks: Sequence[str] = tuple(ATTACKS)
) -> dict[str, Any]:
    image = bring_up(engine)
    addresses = {front: f"127.0.0.1:{free_port()}" for front in ("e2b", "mcp", "console")}
    started = datetime.now(UTC).isoformat(timespec="seconds")
    progress(f"{engine}: another tenant's calls while one attacks, {len(attacks)} attacks")
    with tenants_file("attacker", "quiet") as (path, tokens):
        auth = f'[auth]\ntokens_file = "{path}"\n'
        with served(engine, config(addresses), auth=auth) as sup:
            result = measure(addresses, sup.target, tokens, n, warmup, attacks)
    return {"started_at": started, "image": image, "n": n, "warmup": warmup, **result}


def section(engine: str, result: dict[str, Any]) -> str:
    """The table `make bench` prints for one engine."""
    head = f"== {engine}: another tenant's warm calls while one attacks the HTTP fronts"
    if "error" in result:
        return f"{head} ==\n  n/a: {result['error']}"
    alone = result["alone"]
    lines = [
        f"{head} (median ms, x idle; target: within {TARGET_RATIO:g}x) ==",
        f"  {'':42}{'gRPC exec true':>24}{'E2B commands.run':>26}",
        f"  {'idle':42}{alone['grpc']['median_ms']:>10.2f}{'':14}"
        f"{alone['e2b']['median_ms']:>10.2f}",
    ]
    for name, r in result["attacks"].items():
        cells = "".join(
            f"{r[side]['median_ms']:>10.2f}{r[side]['ratio']:>7.2f}x "
            f"{'met' if r[side]['met'] else 'NOT met':<8}"
            for side in ("grpc", "e2b")
        )
        lines.append(f"  {name:42}{cells}")
    lines.append("  what the attacker's requests got:")
    for name, r in result["attacks"].items():
        got = ", ".join(f"{answer} x{count}" for answer, count in r["answers"].items())
        lines.append(f"    {name}: {got}")
    return "\n".join(lines)


def run(engines: Sequence[str], n: int, warmup: int) -> int:
    """`python -m bench --only front-abuse`: measure, print, record under
    engines.<engine>.front_abuse."""
    return run_alone(
        engines, functools.partial(measure_engine, n=n, warmup=warmup), section, "front_abuse"
    )
