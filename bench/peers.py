"""The peers, on the same engine and image: the engine's CLI (`exec C true` on a plain
container) and llm-sandbox (`execute_command("true")`, one exec_run per call)."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator, Sequence
from typing import Any

from bench import memory
from bench.engines import (
    BENCH_LABEL,
    cli,
    cli_env,
    cli_path,
    engine_url,
    remove_container,
)
from bench.memory import processes
from bench.stockade_runs import SETTLE_S
from bench.timing import Result, time_calls

SLEEPER = ["sleep", "infinity"]
"""What the peers' containers run instead of the image's entrypoint (the Stockade agent)."""


@contextlib.contextmanager
def plain_container(
    engine: str, image: str, run_id: str, command: Sequence[str] = SLEEPER
) -> Iterator[str]:
    """A container of the image running `command` (`sleep infinity`), no network; removed on
    exit."""
    started = cli(
        engine, "run", "-d", "--pull", "never", "--network", "none",
        "--label", f"{BENCH_LABEL}={run_id}", "--entrypoint", command[0], image, *command[1:],
    )  # fmt: skip
    cid = started.stdout.strip().splitlines()[-1]
    try:
        yield cid
    finally:
        remove_container(engine, cid)


def cli_exec(engine: str, image: str, run_id: str, n: int, warmup: int) -> Result:
    """`<engine> exec C true`, one CLI process per call."""
    command = [cli_path(engine), "exec", "", "true"]
    env = cli_env()

    def once() -> None:
        proc = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(command)}: {proc.stderr.decode(errors='replace')}")

    with plain_container(engine, image, run_id) as cid:
        command[2] = cid
        result = time_calls(once, n, warmup)
    result["client"] = command[0]
    return result


def llm_sandbox_exec(engine: str, image: str, run_id: str, n: int, warmup: int) -> Result:
    """llm-sandbox's `execute_command("true")` in a session on our engine and image."""
    session = _llm_session(engine, image, run_id)
    session.open()
    try:
        output = session.execute_command("true")
        if output.exit_code != 0:
            raise RuntimeError(f"execute_command('true') exited {output.exit_code}")
        result = time_calls(lambda: session.execute_command("true"), n, warmup)
        if engine == "podman":
            result["conmon_left_behind"] = _exec_conmons(session.container.id)
    finally:
        _close(engine, session)
    return result


def _llm_session(engine: str, image: str, run_id: str) -> Any:
    """A session with what a local image without registry access needs (BENCH-NOTES):
    the image's entrypoint is the Stockade agent, so it is replaced by `sleep infinity`;
    the default set-up (venv + pip) would need the network, so it is skipped."""
    runtime_configs = {
        "entrypoint": SLEEPER[:1],
        "command": SLEEPER[1:],
        "network_mode": "none",
        "labels": {BENCH_LABEL: run_id},
    }
    options = {
        "image": image, "lang": "python", "skip_environment_setup": True,
        "runtime_configs": runtime_configs,
    }  # fmt: skip
    if engine == "podman":
        import podman
        from llm_sandbox.podman import SandboxPodmanSession

        client = podman.PodmanClient(base_url=engine_url("podman"))
        return SandboxPodmanSession(client=client, **options)
    import docker
    from llm_sandbox.docker import SandboxDockerSession

    return SandboxDockerSession(
        client=docker.DockerClient(base_url=engine_url("docker")), **options
    )


def _close(engine: str, session: Any) -> None:
    """Remove the container ourselves (llm-sandbox's close() stops it first: 10 s, since
    `sleep` ignores SIGTERM), then let the session close what is left."""
    if session.container is not None:
        remove_container(engine, session.container.id)
        session.container = None
    session.close()
    session.client.close()


def _exec_conmons(container_id: str) -> int:
    """conmon processes still alive for execs of that container (Podman's REST exec)."""
    return sum(
        1
        for p in processes()
        if p.comm == "conmon" and container_id in p.cmdline and "--exec" in p.cmdline
    )


PYTHON_FLOOR = ["python3", "-c", "import time; time.sleep(3600)"]
"""The least a Python process of the image costs: the floor under the agent's memory."""


def python_floor(engine: str, image: str, run_id: str) -> dict[str, Any]:
    """PSS, USS and RSS (MiB) of an idle `python3` in a container of the image, no agent, no
    tini (issue 30: what the agent's memory cannot go under while it is Python)."""
    with plain_container(engine, image, run_id, PYTHON_FLOOR) as cid:
        time.sleep(SETTLE_S)
        found = memory.container_memory(cid, memory.processes())
    return {f"{kind}_mib": round(found["inside"][f"{kind}_kib"] / 1024, 2) for kind in memory.KINDS}
