"""`stockade serve` with engine.kind = "kubernetes", as a child process (cli/launcher.py),
against kmock's emulated API server and the test kubelet (the real agent per pod on
127.0.0.N): it starts with no engine service of this host, answers health and
ListSandboxes, runs a tool in a pod over mutual TLS, and adopts the pod after a restart.
And what a pod cannot do is refused when the configuration is loaded."""

from __future__ import annotations

from pathlib import Path

import pytest

from stockade.client import Stockade, Unimplemented
from stockade.supervisor.cli import launcher
from stockade.supervisor.cli.doctor import run_checks
from stockade.supervisor.cli.parsing import command_parser
from stockade.supervisor.config import load_config
from stockade.supervisor.errors import ConfigError
from tests.unit.fakes import free_port
from tests.unit.kube_mock import NAMESPACE, Kubelet, KubeMock

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("kube_ca")]


def _config(tmp_path: Path, kube: KubeMock, listen: str, agent_port: int) -> Path:
    path = tmp_path / "stockade.toml"
    path.write_text(
        f'listen = "{listen}"\n'
        f'state_dir = "{tmp_path / "state"}"\n'
        '[engine]\nkind = "kubernetes"\n'
        "[auth]\nenabled = false\n"
        "[sandbox]\n"
        'image = "registry.example/stockade-sandbox:test"\n'
        "tmp_inodes = 0\n"
        "[kubernetes]\n"
        f'namespace = "{NAMESPACE}"\n'
        f'kubeconfig = "{kube.kubeconfig(tmp_path)}"\n'
        f"agent_port = {agent_port}\n"
        "ready_timeout_s = 60\n"
    )
    return path


def test_serve_with_pods(kube: KubeMock, tmp_path: Path) -> None:
    target, agent_port = f"127.0.0.1:{free_port()}", free_port()
    config = _config(tmp_path, kube, target, agent_port)
    kubelet = Kubelet(kube, tmp_path / "nodes", agent_port)
    log = tmp_path / "serve.log"
    try:
        served = launcher.spawn(config, log)
        try:
            launcher.wait_serving(target, served, log)
            with Stockade(target) as client:
                assert client.list_sandboxes() == []
                result = client.sandbox("demo").exec("echo from a pod > f && cat f")
                assert (result.exit_code, result.stdout) == (0, "from a pod\n")
                [listed] = client.list_sandboxes()
                assert (listed.key, listed.state) == ("demo", "RUNNING")
                assert listed.engine == "kubernetes"
        finally:
            launcher.stop(served)
        [pod] = kube.names("pod")  # a stopped supervisor leaves its pods for the next start
        assert pod in kubelet.played

        again = launcher.spawn(config, log)
        try:
            launcher.wait_serving(target, again, log)
            assert "adopted 1 running sandbox(es)" in log.read_text()
            with Stockade(target) as client:
                assert client.sandbox("demo").exec("cat f").stdout == "from a pod\n"
                with pytest.raises(Unimplemented, match="a pod cannot be paused"):
                    client.pause_sandbox("demo")
                assert client.destroy_sandbox("demo", delete_workspace=True)
        finally:
            launcher.stop(again)
    finally:
        kubelet.close()
    assert kube.names("pod") == []
    assert kube.names("claim") == []
    assert "podman" not in log.read_text().lower()  # no engine service of this host


@pytest.mark.parametrize(
    ("setting", "words"),
    [
        ('[housekeeping]\nidle_action = "pause"\n', 'idle_action = "pause"'),
        ("[sandbox]\nworkspace_size_mb = 512\n", "sandbox.workspace_size_mb"),
        ("[network]\nbandwidth_kbit = 1000\n", "network.bandwidth_kbit"),
    ],
)
def test_what_pods_cannot_do_is_refused_at_load(tmp_path: Path, setting: str, words: str) -> None:
    path = tmp_path / "stockade.toml"
    path.write_text(f'[engine]\nkind = "kubernetes"\n{setting}')
    with pytest.raises(ConfigError, match=f"{words}.* does not go with engine.kind kubernetes"):
        load_config(path)
    path.write_text(f'[engine]\nkind = "podman"\n{setting}')
    load_config(path)  # the host kinds can


def test_egress_on_pods_needs_the_egress_service(tmp_path: Path) -> None:
    """Each egress pod is told the Service's address as its proxy: without one, refused at
    load, naming the setting; with one, loaded, the listener's address defaulted."""
    path = tmp_path / "stockade.toml"
    path.write_text('[engine]\nkind = "kubernetes"\n[sandbox]\nnetwork = "egress"\n')
    with pytest.raises(ConfigError, match=r"needs kubernetes\.egress_proxy"):
        load_config(path)
    path.write_text(
        '[engine]\nkind = "kubernetes"\n[sandbox]\nnetwork = "egress"\n'
        '[kubernetes]\negress_proxy = "stockade-egress.stockade.svc:3128"\n'
    )
    config = load_config(path)
    assert config.kubernetes.egress_listen == "0.0.0.0:3128"


def test_a_warm_pool_of_pods_is_accepted_at_load(tmp_path: Path) -> None:
    path = tmp_path / "stockade.toml"
    path.write_text('[engine]\nkind = "kubernetes"\n[housekeeping]\nwarm_pool = 2\n')
    assert load_config(path).housekeeping.warm_pool == 2


def test_the_command_line_takes_the_kubernetes_kind() -> None:
    parser = command_parser()
    assert parser.parse_args(["serve", "--engine", "kubernetes"]).engine == "kubernetes"
    assert parser.parse_args(["doctor", "--engine", "kubernetes"]).engine == "kubernetes"


def test_doctor_checks_the_cluster(kube: KubeMock, tmp_path: Path) -> None:
    config = load_config(_config(tmp_path, kube, "127.0.0.1:0", 7443))
    [check] = run_checks(config)
    assert check.ok, check
    assert check.detail == (
        "API server v1.30.0-kmock; namespace stockade: 0 sandbox pod(s), agent CA stockade-agent-ca"
    )
    kube.react(lambda k: k["get /api/v1/namespaces/stockade/secrets/stockade-agent-ca"] << 403)
    [check] = run_checks(config)
    assert not check.ok
    assert "refuses to read secret stockade-agent-ca" in check.detail
    assert "deploy/kubernetes" in check.fix
