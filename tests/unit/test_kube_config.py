"""[kubernetes] and [state] refuse what would reach the API server, a pod spec or a database
URL wrong: each bad value is refused at load with the key it concerns, huge and hostile ones
included, and the defaults load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stockade.supervisor.errors import ConfigError
from tests.unit.fakes import config_from


def load(tmp_path: Path, text: str) -> Any:
    return config_from(tmp_path, text)


def test_the_defaults_load(tmp_path: Path) -> None:
    config = load(tmp_path, '[engine]\nkind = "kubernetes"\n')
    assert config.kubernetes.namespace == "stockade"
    assert config.kubernetes.agent_port == 7443
    assert config.state.url == ""


@pytest.mark.parametrize(
    ("setting", "where"),
    [
        ('namespace = "Stockade"', "kubernetes.namespace"),
        ('namespace = ""', "kubernetes.namespace"),
        (f'namespace = "{"a" * 64}"', "kubernetes.namespace"),
        ('namespace = "a/../b"', "kubernetes.namespace"),
        ('namespace = "a\\u0000b"', "kubernetes.namespace"),
        ('ca_secret = ""', "kubernetes.ca_secret"),
        ('ca_secret = "../etc"', "kubernetes.ca_secret"),
        ('runtime_class = "gVisor"', "kubernetes.runtime_class"),
        ('workspace = "hostpath"', "kubernetes.workspace"),
        ('storage_class = "a b"', "kubernetes.storage_class"),
        ("workspace_size_mb = 0", "kubernetes.workspace_size_mb"),
        ("workspace_size_mb = -1", "kubernetes.workspace_size_mb"),
        (f"ephemeral_storage_mb = {1 << 40}", "kubernetes.ephemeral_storage_mb"),
        ("agent_port = 0", "kubernetes.agent_port"),
        ("agent_port = 65536", "kubernetes.agent_port"),
        ("ready_timeout_s = nan", "kubernetes.ready_timeout_s"),
        ("ready_timeout_s = inf", "kubernetes.ready_timeout_s"),
        ("ready_timeout_s = -1.0", "kubernetes.ready_timeout_s"),
        ('image_pull_policy = "always"', "kubernetes.image_pull_policy"),
        ("supervisor_labels = {}", "kubernetes.supervisor_labels"),
        ('supervisor_labels = {"a b" = "x"}', "kubernetes.supervisor_labels"),
        ('supervisor_labels = {app = "x y"}', "kubernetes.supervisor_labels"),
        ('egress_proxy = "proxy"', "kubernetes.egress_proxy"),
        ('egress_proxy = "proxy:99999"', "kubernetes.egress_proxy"),
        ('egress_proxy = "a b:3128"', "kubernetes.egress_proxy"),
        ('egress_proxy = "http://proxy:3128"', "kubernetes.egress_proxy"),
        ('egress_proxy = "proxy:3128\\nX-Evil: 1"', "kubernetes.egress_proxy"),
        (f'egress_proxy = "{"a" * 300}:3128"', "kubernetes.egress_proxy"),
        ('egress_listen = "3128"', "kubernetes.egress_listen"),
        ('egress_listen = "0.0.0.0:0"', "kubernetes.egress_listen"),
        ('egress_listen = "0.0.0.0:70000"', "kubernetes.egress_listen"),
        ('egress_listen = "proxy.example:3128"', "kubernetes.egress_listen"),
        ('egress_listen = "0.0.0.0:3128 --evil"', "kubernetes.egress_listen"),
        (f'egress_listen = "{"9" * 100000}"', "kubernetes.egress_listen"),
        ("egress_listen = 3128", "kubernetes.egress_listen"),
        ('seccomp_profile = "/etc/passwd"', "kubernetes.seccomp_profile"),
        ('seccomp_profile = "profiles/../../x.json"', "kubernetes.seccomp_profile"),
    ],
)
def test_bad_kubernetes_settings_are_refused_naming_them(
    tmp_path: Path, setting: str, where: str
) -> None:
    with pytest.raises(ConfigError, match=where.replace(".", r"\.")):
        load(tmp_path, f'[engine]\nkind = "kubernetes"\n[kubernetes]\n{setting}\n')


def test_an_unknown_engine_kind_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"engine\.kind must be one of .*kubernetes.*nomad"):
        load(tmp_path, '[engine]\nkind = "nomad"\n')


@pytest.mark.parametrize(
    "url", ["mysql://u:hunter2@h/db", "http://u:hunter2@h/db", "file:///hunter2", " hunter2"]
)
def test_a_state_url_of_another_scheme_is_refused_without_echoing_it(
    tmp_path: Path, url: str
) -> None:
    with pytest.raises(ConfigError, match=r"state\.url must be a postgresql:// URL") as caught:
        load(tmp_path, f'[state]\nurl = "{url}"\n')
    assert "hunter2" not in str(caught.value)  # a URL may hold a password


def test_a_postgres_url_loads(tmp_path: Path) -> None:
    for url in ("postgresql://u:p@127.0.0.1:5432/db", "postgres://h/db?sslmode=verify-full"):
        assert load(tmp_path, f'[state]\nurl = "{url}"\n').state.url == url
