"""[honeytokens]: defaults, what applies where, and wrong, huge and hostile values refused at
load with a message naming the setting."""

from __future__ import annotations

from pathlib import Path

import pytest

from stockade.supervisor.config import HoneytokensConfig, load_config
from stockade.supervisor.config.honey import check_path
from stockade.supervisor.errors import ConfigError
from tests.unit.fakes import config_from


def load(tmp_path: Path, text: str) -> HoneytokensConfig:
    return config_from(tmp_path, text).honeytokens


def test_defaults_are_off_and_all_kinds() -> None:
    honey = load_config().honeytokens
    assert not honey.enabled
    assert honey.kinds == ("aws", "github", "netrc", "env")
    assert (honey.on_read, honey.on_use) == ("alert", "quarantine")
    assert not honey.workspace_env
    assert not honey.applies("", "base")


def test_a_full_table_loads(tmp_path: Path) -> None:
    honey = load(
        tmp_path,
        "[profiles.honey]\n"
        "[honeytokens]\nenabled = true\nkinds = ['aws', 'netrc']\n"
        "paths = ['/tmp/keys.txt', '~/.config/x/token', 'deploy/.env.prod']\n"
        "workspace_env = true\nenv_var = 'GH_TOKEN'\non_read = 'quarantine'\n"
        "on_use = 'alert'\nprofiles = ['honey']\ntenants = ['acme']\n",
    )
    assert honey.paths == ("/tmp/keys.txt", "~/.config/x/token", "deploy/.env.prod")
    assert (honey.env_var, honey.on_read, honey.on_use) == ("GH_TOKEN", "quarantine", "alert")
    assert honey.applies("acme", "honey")
    assert not honey.applies("acme", "base")  # not a listed profile
    assert not honey.applies("other", "honey")  # not a listed tenant
    assert not honey.applies("", "honey")  # no tenant (auth off) is not "acme"


def test_empty_lists_mean_every_sandbox() -> None:
    honey = HoneytokensConfig(enabled=True)
    assert honey.applies("", "")
    assert honey.applies("t", "base")
    assert honey.applies("t", "gpu")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("kinds = ['aws', 'ssh']", "unknown 'ssh'"),
        ("kinds = ['aws', 'aws']", "twice"),
        ("kinds = 'aws'", "must be a list"),
        ("kinds = [1]", "must be str"),
        ("enabled = 'yes'", "must be bool"),
        ("on_read = 'ignore'", "must be one of"),
        ("on_use = 'QUARANTINE'", "must be one of"),
        ("env_var = ''", "env_var"),
        ("env_var = 'PATH'", "env_var"),
        ("env_var = 'HTTPS_PROXY'", "env_var"),
        ("env_var = '1X'", "env_var"),
        ("env_var = 'A B'", "env_var"),
        ("env_var = 'A=B'", "env_var"),
        ("env_var = 'A\\u0000'", "env_var"),
        ("env_var = '" + "A" * 129 + "'", "env_var"),
        ("profiles = ['nope']", "unknown 'nope'"),
        ("tenants = ['bad tenant']", "tenants"),
        ("tenants = ['']", "tenants"),
        ("surprise = 1", "unknown key"),
    ],
)
def test_wrong_values_are_refused(tmp_path: Path, text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        load(tmp_path, f"[honeytokens]\n{text}\n")


def test_env_var_that_hides_a_real_secret_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"sandbox\.secrets"):
        load(
            tmp_path,
            "[sandbox.secrets]\nAWS_SECRET_ACCESS_KEY = 'real'\n[honeytokens]\nenabled = true\n",
        )
    # without the env kind the variable is not planted: no clash
    honey = load(
        tmp_path,
        "[sandbox.secrets]\nAWS_SECRET_ACCESS_KEY = 'real'\n[honeytokens]\nkinds = ['aws']\n",
    )
    assert honey.kinds == ("aws",)


@pytest.mark.parametrize(
    "path",
    [
        "",
        "a/",
        "~",
        ".",
        "/",
        "~root/.netrc",
        "../outside",
        "a/../../b",
        "/workspace/../etc/passwd",
        "a\nb",
        "a\x00b",
        "a\x1bb",
        "/proc/self/environ",
        "/sys/x",
        "/dev/shm/x",
        "/run/stockade/agent.sock",
        "/etc/passwd",
        "/usr/local/bin/x",
        "x" * 1025,
        "é" * 600,
    ],
)
def test_hostile_paths_are_refused(path: str) -> None:
    with pytest.raises(ConfigError, match=r"honeytokens\.paths"):
        check_path(path)


def test_paths_are_normalised_and_duplicates_refused(tmp_path: Path) -> None:
    assert check_path("./a//b") == "a/b"
    assert check_path("~/x/./y") == "~/x/y"
    assert check_path("/tmp//z") == "/tmp/z"
    assert check_path("/etcetera/x") == "/etcetera/x"  # only the folder itself is off limits
    with pytest.raises(ConfigError, match="twice"):
        load(tmp_path, "[honeytokens]\npaths = ['a/b', './a/b']\n")


def test_huge_lists_are_refused(tmp_path: Path) -> None:
    many = ", ".join(f"'p{i}'" for i in range(33))
    with pytest.raises(ConfigError, match="at most 32"):
        load(tmp_path, f"[honeytokens]\npaths = [{many}]\n")
    tenants = ", ".join(f"'t{i}'" for i in range(1025))
    with pytest.raises(ConfigError, match="at most 1024"):
        load(tmp_path, f"[honeytokens]\ntenants = [{tenants}]\n")


def test_kubernetes_is_refused_for_now(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"not available with engine\.kind = kubernetes"):
        load(tmp_path, "[engine]\nkind = 'kubernetes'\n[honeytokens]\nenabled = true\n")
