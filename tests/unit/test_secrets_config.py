"""[secrets.NAME] refuses what would put a credential in the wrong place: each wrong, huge or
hostile value is refused at load naming the key, and the value itself is never in an error,
a repr or the config file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from stockade.supervisor.config.loading import load_config
from stockade.supervisor.errors import ConfigError
from tests.unit.fakes import config_from

VALUE = "ghp_RealSecretValue0123456789abcdefXYZ"
HOSTS_65 = "hosts = [" + ", ".join(['"a.com"'] * 65) + "]"
HEAD = '[sandbox]\nnetwork = "egress"\n[profiles.big]\nmemory_mb = 1024\n'


def secret_file(tmp_path: Path, text: str = VALUE + "\n", mode: int = 0o600) -> Path:
    path = tmp_path / "token"
    path.write_text(text)
    path.chmod(mode)
    return path


def load(tmp_path: Path, body: str, head: str = HEAD) -> Any:
    return config_from(tmp_path, head + body)


def github(tmp_path: Path, extra: str = "", *, source: str | None = None) -> str:
    if source is None:
        source = f'file = "{secret_file(tmp_path)}"'
    return (
        "[secrets.github]\n"
        f"{source}\n"
        'hosts = ["api.github.com", "*.githubusercontent.com"]\n'
        'template = "Bearer {secret}"\n'
        'sandbox_env = "GITHUB_TOKEN"\n' + extra
    )


def test_a_file_secret_loads_and_hides_its_value(tmp_path: Path) -> None:
    config = load(tmp_path, github(tmp_path))
    secret = config.secrets["github"]
    assert secret.value == VALUE  # the trailing newline dropped
    assert secret.header == ""
    assert secret.template == "Bearer {secret}"
    assert VALUE not in repr(config)
    assert VALUE not in repr(secret)
    assert VALUE not in str(secret)


def test_an_env_secret_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOST_GH_TOKEN", VALUE)
    config = load(tmp_path, github(tmp_path, source='env = "HOST_GH_TOKEN"'))
    assert config.secrets["github"].value == VALUE


def test_basic_auth_and_scoping_load(tmp_path: Path) -> None:
    body = (
        "[secrets.git]\n"
        f'file = "{secret_file(tmp_path)}"\n'
        'hosts = ["git.example.com"]\nbasic_user = "x-access-token"\n'
        'sandbox_env = "GIT_TOKEN"\ntenants = ["team-a"]\nprofiles = ["base", "big"]\n'
    )
    secret = load(tmp_path, body).secrets["git"]
    assert secret.basic_user == "x-access-token"
    assert secret.tenants == ("team-a",)


def test_no_secrets_is_the_default(tmp_path: Path) -> None:
    assert load(tmp_path, "", head="").secrets == {}


def test_the_value_cannot_come_from_the_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown key.*value"):
        load(tmp_path, github(tmp_path, 'value = "ghp_inline_secret_value"\n'))


@pytest.mark.parametrize(
    ("extra", "where"),
    [
        ('header = "Authorization"\nbasic_user = "x"\n', "secrets.github"),
        ('header = "Content-Length"\n', "secrets.github.header"),
        ('header = "Host"\n', "secrets.github.header"),
        ('header = "X-A\\r\\nX-B"\n', "secrets.github.header"),
        (f'header = "{"X" * 65}"\n', "secrets.github.header"),
        ('tenants = ["bad tenant!"]\n', "secrets.github.tenants"),
        ('profiles = ["nope"]\n', "secrets.github.profiles"),
    ],
)
def test_wrong_placement_and_scope_are_refused(tmp_path: Path, extra: str, where: str) -> None:
    with pytest.raises(ConfigError, match=where.replace(".", r"\.")):
        load(tmp_path, github(tmp_path, extra))


@pytest.mark.parametrize(
    ("line", "where"),
    [
        ("hosts = []", "secrets.x.hosts"),
        ('hosts = ["*"]', "secrets.x.hosts"),
        ('hosts = ["*.*"]', "secrets.x.hosts"),
        ('hosts = ["127.0.0.1"]', "secrets.x.hosts"),
        ('hosts = ["[::1]"]', "secrets.x.hosts"),
        ('hosts = ["2130706433"]', "secrets.x.hosts"),
        ('hosts = ["API.example.com"]', "secrets.x.hosts"),
        ('hosts = ["a..b"]', "secrets.x.hosts"),
        ('hosts = ["ex ample.com"]', "secrets.x.hosts"),
        (f'hosts = ["{"a" * 300}.com"]', "secrets.x.hosts"),
        (HOSTS_65, "secrets.x.hosts"),
        ('template = "Bearer"', "secrets.x.template"),
        ('template = "{secret}{secret}"', "secrets.x.template"),
        ('template = "Bearer {secret}\\r\\nX-Evil: 1"', "secrets.x.template"),
        (f'template = "{"a" * 300}{{secret}}"', "secrets.x.template"),
        ('template = ""', "secrets.x"),
        ('basic_user = "a:b"', "secrets.x.basic_user"),
        ('basic_user = "a\\nb"', "secrets.x.basic_user"),
        ('sandbox_env = ""', "secrets.x.sandbox_env"),
        ('sandbox_env = "1ABC"', "secrets.x.sandbox_env"),
        ('sandbox_env = "A=B"', "secrets.x.sandbox_env"),
        ('sandbox_env = "HTTPS_PROXY"', "secrets.x.sandbox_env"),
        ('sandbox_env = "NODE_OPTIONS"', "secrets.x.sandbox_env"),
        ('sandbox_env = "STOCKADE_X"', "secrets.x.sandbox_env"),
        ('sandbox_env = "OTHER"', "secrets.other.sandbox_env"),
    ],
)
def test_wrong_huge_and_hostile_values_are_refused(tmp_path: Path, line: str, where: str) -> None:
    fields = {
        "file": f'"{secret_file(tmp_path)}"',
        "hosts": '["api.example.com"]',
        "template": '"Bearer {secret}"',
        "sandbox_env": '"TOKEN"',
    }
    key, _, value = line.partition(" = ")
    if key == "basic_user":
        fields.pop("template")
    fields[key] = value
    other = (
        "[secrets.other]\n"
        f"file = {fields['file']}\n"
        'hosts = ["b.example.com"]\ntemplate = "{secret}"\nsandbox_env = "OTHER"\n'
    )
    body = "[secrets.x]\n" + "".join(f"{k} = {v}\n" for k, v in fields.items()) + other
    with pytest.raises(ConfigError, match=where.replace(".", r"\.")) as caught:
        load(tmp_path, body)
    assert VALUE not in str(caught.value)


@pytest.mark.parametrize("name", ["GitHub", "-x", "a b", "a.b", "x" * 65, "ünï", "a\u0000b"])
def test_bad_secret_names_are_refused(tmp_path: Path, name: str) -> None:
    text = github(tmp_path).replace("[secrets.github]", f'[secrets."{name}"]')
    with pytest.raises(ConfigError, match="name is 1 to 64"):
        load(tmp_path, text.replace("\u0000", "\\u0000"))


@pytest.mark.parametrize(
    ("content", "mode", "why"),
    [
        (VALUE, 0o644, "open to other users"),
        (VALUE, 0o602, "open to other users"),
        ("short", 0o600, "shorter than 8"),
        ("", 0o600, "shorter than 8"),
        ("a" * 9000, 0o600, "longer than 8192"),
        ("tok en with\x00nul", 0o600, "printable ASCII"),
        ("line1\nline2", 0o600, "printable ASCII"),
        (" " + VALUE, 0o600, "printable ASCII"),
        ("ünïcödé-secret-value", 0o600, "printable ASCII"),
        ("stk_ph_abcdefghijklmnopqrstuvwxyz234567", 0o600, "a placeholder"),
    ],
)
def test_bad_secret_files_are_refused_without_showing_the_value(
    tmp_path: Path, content: str, mode: int, why: str
) -> None:
    source = f'file = "{secret_file(tmp_path, content, mode)}"'
    with pytest.raises(ConfigError, match=why) as caught:
        load(tmp_path, github(tmp_path, source=source))
    assert "secrets.github.file" in str(caught.value)
    if len(content) >= 8:
        assert content.strip() not in str(caught.value)


def test_missing_linked_and_special_files_are_refused(tmp_path: Path) -> None:
    real = secret_file(tmp_path)
    link = tmp_path / "link"
    link.symlink_to(real)
    for source, why in [
        (f'file = "{tmp_path / "absent"}"', "cannot open"),
        ('file = "relative/token"', "absolute path"),
        (f'file = "{link}"', "cannot open"),
        ('file = "/dev/zero"', "not a regular file"),
        (f'file = "{tmp_path}"', "not a regular file"),
    ]:
        with pytest.raises(ConfigError, match=why):
            load(tmp_path, github(tmp_path, source=source))


def test_file_and_env_together_or_neither_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOST_GH_TOKEN", VALUE)
    both = f'file = "{secret_file(tmp_path)}"\nenv = "HOST_GH_TOKEN"'
    for source in (both, ""):
        with pytest.raises(ConfigError, match="exactly one of file and env"):
            load(tmp_path, github(tmp_path, source=source))


def test_unset_and_bad_env_variables_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("STK_TEST_UNSET", raising=False)
    with pytest.raises(ConfigError, match="STK_TEST_UNSET is not set"):
        load(tmp_path, github(tmp_path, source='env = "STK_TEST_UNSET"'))
    with pytest.raises(ConfigError, match=r"secrets\.github\.env must be a variable name"):
        load(tmp_path, github(tmp_path, source='env = "A=B"'))
    monkeypatch.setenv("STK_TEST_BAD", "has\nnewline-in-it")
    with pytest.raises(ConfigError, match="printable ASCII") as caught:
        load(tmp_path, github(tmp_path, source='env = "STK_TEST_BAD"'))
    assert "newline-in-it" not in str(caught.value)


def test_secrets_need_network_mode_egress(tmp_path: Path) -> None:
    head = '[sandbox]\nnetwork = "open"\n'
    with pytest.raises(ConfigError, match=r'needs sandbox\.network = "egress"'):
        load(tmp_path, github(tmp_path), head=head)


def test_too_many_secrets_are_refused(tmp_path: Path) -> None:
    path = secret_file(tmp_path)
    body = "".join(
        f'[secrets.s{i}]\nfile = "{path}"\nhosts = ["a.com"]\ntemplate = "{{secret}}"\n'
        f'sandbox_env = "T{i}"\n'
        for i in range(65)
    )
    with pytest.raises(ConfigError, match="at most 64"):
        load(tmp_path, body)


def test_a_sandbox_env_clash_with_sandbox_secrets_is_refused(tmp_path: Path) -> None:
    head = HEAD + '[sandbox.secrets]\nGITHUB_TOKEN = "plain-secret-value"\n'
    with pytest.raises(ConfigError, match=r"\[sandbox\] secrets"):
        load(tmp_path, github(tmp_path), head=head)


@pytest.mark.parametrize("value", ["relative.pem", "/nonexistent/ca.pem", "/tmp"])
def test_upstream_ca_file_must_be_an_absolute_file(tmp_path: Path, value: str) -> None:
    with pytest.raises(ConfigError, match=r"network\.upstream_ca_file"):
        load(tmp_path, f'[network]\nupstream_ca_file = "{value}"\n')
    pem = tmp_path / "ca.pem"
    pem.write_text("x")
    assert load(tmp_path, f'[network]\nupstream_ca_file = "{pem}"\n').network.upstream_ca_file


def test_the_environment_is_left_as_it_was(tmp_path: Path) -> None:
    before = dict(os.environ)
    load(tmp_path, github(tmp_path))
    assert dict(os.environ) == before


def test_a_decoy_variable_cannot_be_a_placeholder_variable(tmp_path: Path) -> None:
    """[honeytokens] env_var and a secret's sandbox_env name one variable: refused, naming
    both, since a sandbox cannot hold a decoy and a placeholder in it."""
    value = tmp_path / "token"
    value.write_text("s3cr3t-value-1234")
    value.chmod(0o600)
    path = tmp_path / "stockade.toml"
    path.write_text(
        '[sandbox]\nnetwork = "egress"\n[network]\nallow = ["api.example.com"]\n'
        f'[secrets.gh]\nfile = "{value}"\nhosts = ["api.example.com"]\n'
        'template = "Bearer {secret}"\nsandbox_env = "GH_TOKEN"\n'
        '[honeytokens]\nenabled = true\nenv_var = "GH_TOKEN"\n'
    )
    with pytest.raises(ConfigError, match=r"honeytokens\.env_var 'GH_TOKEN' is the sandbox_env"):
        load_config(path)
