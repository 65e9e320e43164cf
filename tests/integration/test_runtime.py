"""sandbox.runtime against the real engines: an explicit runc, a runtime the engine does not
know (the sandbox's creation fails with a clear error and leaves nothing behind), what
`stockade doctor` lists. gVisor itself is in tests/security/test_gvisor.py."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from stockade.client import StockadeError
from stockade.supervisor.sandboxes import workspaces
from tests.integration.harness import (
    SANDBOX_UID,
    Supervisor,
    engine_url,
    instance_containers,
    running_supervisor,
)
from tests.integration.test_cli import cli

pytestmark = pytest.mark.timeout(300)


def test_runc_named_explicitly(engine: str, key: str) -> None:
    with running_supervisor(engine, '[sandbox]\nruntime = "runc"\n') as sup, sup.client() as c:
        result = c.sandbox(key).exec("echo ran; id -u")
        assert result.exit_code == 0, result.for_llm
        assert result.stdout == f"ran\n{SANDBOX_UID}\n"
        report = c.inspect_isolation(key).to_dict()
        assert report["outside"]["runtime"] == "runc"
        runtime = report["runtime"]
        assert runtime["name"] == "runc"
        assert runtime["version"], "the default runtime's facts apply: it is the same runc"
        assert "NOT_APPLICABLE" not in {c["verdict"] for c in runtime["cves"]}, "runc is judged"
        doctor = cli(sup, "doctor", "--config", str(sup.config_file()))
        line = next(x for x in doctor.stdout.splitlines() if "] runtimes: " in x)
        assert line.startswith("[ok  ] runtimes: known: "), doctor.stdout
        assert "runc (default)" in line
        assert "sandbox.runtime: runc" in line


@pytest.mark.parametrize("runtime", ["no-such-runtime", "/nonexistent/bin/runsc"])
def test_an_unknown_runtime_fails_the_creation_clearly(engine: str, key: str, runtime: str) -> None:
    config = f'[sandbox]\nruntime = "{runtime}"\n'
    with running_supervisor(engine, config) as sup, sup.client() as c:
        for _attempt in range(2):  # the supervisor stays up and says the same again
            with pytest.raises(StockadeError) as caught:
                c.sandbox(key).ensure()
            error = caught.value
            assert error.code == "FAILED_PRECONDITION", error
            assert error.reason == "CONFIG_INVALID"
            message = str(error)
            assert f"sandbox.runtime {runtime!r}" in message or f"is {runtime!r}" in message
            register = "daemon.json" if engine == "docker" else "containers.conf"
            assert register in message, message
        assert instance_containers(engine, engine_url(engine), sup) == [], "nothing left"
        tmp = sup.state_dir / "sandboxes"
        assert not any(p.is_mount() for p in tmp.glob("*/tmp")), "no /tmp mount left"
        doctor = cli(sup, "doctor", "--config", str(sup.config_file()))
        line = next(x for x in doctor.stdout.splitlines() if "] runtimes: " in x)
        assert line.startswith("[FAIL] runtimes: "), doctor.stdout


def test_podmans_own_service_refuses_an_unknown_runtime(engine: str) -> None:
    """With no engine.socket the supervisor starts Podman's service with --runtime; a runtime
    Podman cannot find stops the start, naming it."""
    if engine != "podman":
        pytest.skip("Docker has no service the supervisor starts")
    state = Path(tempfile.mkdtemp(prefix="stk", dir="/tmp"))
    sup = Supervisor(engine, state, '[sandbox]\nruntime = "no-such-runtime"\n', engine_socket="")
    try:
        with pytest.raises(RuntimeError) as caught:
            sup.start()
        said = str(caught.value)
        assert "sandbox.runtime 'no-such-runtime'" in said, said
        assert 'default OCI runtime "no-such-runtime" not found' in said
        assert "[engine.runtimes]" in said
    finally:
        sup.stop()
        workspaces.unmount_all(state)  # /tmp tmpfs, layered workspaces
        shutil.rmtree(state, ignore_errors=True)
