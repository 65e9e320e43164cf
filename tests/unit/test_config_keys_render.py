from __future__ import annotations

import re
from pathlib import Path

import pytest

from stockade.supervisor.calls.outcome import _exec_outcome
from stockade.supervisor.calls.pipeline import parse_arguments
from stockade.supervisor.config import Config, load_config
from stockade.supervisor.errors import ConfigError, InvalidRequest
from stockade.supervisor.keys import sandbox_id, validate_key
from stockade.supervisor.text import printable
from stockade.supervisor.tools.render import cap_text, render


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(text)
    return path


def test_config_defaults() -> None:
    cfg = load_config()
    assert cfg.listen == "127.0.0.1:50051"
    assert cfg.engine.kind == "podman"
    assert cfg.sandbox.network == "none"
    assert cfg.sandbox.user == "65532:65532"
    assert cfg.sandbox.user_namespace is None  # on where the engine can: SandboxManager.start
    assert (cfg.sandbox.runtime, cfg.sandbox.tmp_inodes) == ("", 65536)


@pytest.mark.parametrize(
    "runtime", ["runc", "runsc", "io.containerd.runsc.v1", "crun+x", "/usr/bin/runsc"]
)
def test_runtime_names_and_paths(tmp_path: Path, runtime: str) -> None:
    cfg = load_config(write(tmp_path, f"[sandbox]\nruntime = '{runtime}'\ntmp_inodes = 0\n"))
    assert (cfg.sandbox.runtime, cfg.sandbox.tmp_inodes) == (runtime, 0)


def test_config_file_env_and_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, 'listen = "unix:/x.sock"\n[sandbox]\nmemory_mb = 256\ncpus = 2\n')
    monkeypatch.setenv("STOCKADE_ENGINE", "docker")
    cfg = load_config(path, {"state_dir": str(tmp_path)})
    assert (cfg.listen, cfg.engine.kind, cfg.state_dir) == ("unix:/x.sock", "docker", tmp_path)
    assert (cfg.sandbox.memory_mb, cfg.sandbox.cpus) == (256, 2.0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("bogus = 1\n", "unknown key(s) in [top level]: bogus"),
        ("[sandbox]\nmemroy_mb = 1\n", "unknown key(s) in [sandbox]: memroy_mb"),
        ("[sandbox]\nmemory_mb = '512'\n", "sandbox.memory_mb must be int"),
        ("[sandbox]\nmemory_mb = true\n", "sandbox.memory_mb must be int"),
        ("[sandbox]\nmemory_mb = 0\n", "sandbox.memory_mb must be positive"),
        ("[sandbox]\nuser = '0:0'\n", "must not be root"),
        ("[sandbox]\nuser = '5:0'\n", "must not be root"),
        ("[sandbox]\nuser = '65533:65532'\n", "must not be 65533 (the agent's own user)"),
        ("[sandbox]\nuser = '65532:65533'\n", "must not be 65533 (the agent's own user)"),
        ("[sandbox]\nuser = 'sandbox'\n", "sandbox.user must be UID:GID in digits"),
        ("[sandbox]\nuser = '1000:'\n", "sandbox.user must be UID:GID in digits"),
        ("[sandbox]\nuser = '-1:5'\n", "sandbox.user must be UID:GID in digits"),
        ("[sandbox]\nuser = '1:2:3'\n", "sandbox.user must be UID:GID in digits"),
        ("[sandbox]\nuser = '4294967295:1'\n", "nor above 4294967294"),
        ("[sandbox]\nuser = '" + "9" * 5000 + "'\n", "sandbox.user must be UID:GID in digits"),
        ("[sandbox]\nuser_namespace = 'auto'\n", "sandbox.user_namespace must be bool"),
        ("[sandbox]\nnetwork = 'host'\n", "must be one of ['none', 'egress', 'open']"),
        ("[engine]\nkind = 'lxc'\n", "engine.kind must be one of"),
        ("[sandbox]\nworkspace_size_mb = -1\n", "workspace_size_mb must not be negative"),
        ("[sandbox]\nworkspace_size_mb = 8\n", "must be 0 (no cap) or at least 16, got 8"),
        ("[sandbox]\nmax_file_size_mb = -5\n", "max_file_size_mb must not be negative"),
        ("[sandbox]\ntmp_inodes = -1\n", "sandbox.tmp_inodes must not be negative"),
        ("[sandbox]\ntmp_inodes = 1.5\n", "sandbox.tmp_inodes must be int"),
        ("[sandbox]\nruntime = 3\n", "sandbox.runtime must be str"),
        ("[sandbox]\nruntime = '--root=/'\n", "sandbox.runtime must be a name"),
        ("[sandbox]\nruntime = '-runsc'\n", "sandbox.runtime must be a name"),
        ("[sandbox]\nruntime = 'run sc'\n", "sandbox.runtime must be a name"),
        ("[sandbox]\nruntime = 'bin/runsc'\n", "sandbox.runtime must be a name"),
        ("[sandbox]\nruntime = './runsc'\n", "sandbox.runtime must be a name"),
        ("[sandbox]\nruntime = 'runsc\\n'\n", "sandbox.runtime must be a name"),
        ("[sandbox]\nruntime = '/usr/bin/../../x'\n", "must be an absolute path without"),
        ("[sandbox]\nruntime = '/usr/bin/run sc'\n", "must be an absolute path without"),
        ('[sandbox]\nruntime = "/usr/bin/runsc\\t"\n', "must be an absolute path without"),
        ('[sandbox]\nruntime = "runsc\\u0000"\n', "sandbox.runtime must be a name"),
        ("[sandbox]\nruntime = '" + "r" * 5000 + "'\n", "longer than 4096 characters"),
        ("sandbox = 3\n", "[sandbox] must be a table"),
        ("listen = \n", "cannot read config"),
        ("x = " + "[" * 5000 + "]" * 5000 + "\n", "cannot read config"),
    ],
)
def test_bad_config_is_an_error_at_load(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    assert message in str(info.value)


def test_config_is_frozen() -> None:
    cfg = Config()
    with pytest.raises(AttributeError):
        cfg.listen = "x"  # type: ignore[misc]


@pytest.mark.parametrize("key", ["a", "ünïcödé 🔑", "x" * 256, "with space/and:colon", "é" * 128])
def test_good_keys(key: str) -> None:
    assert validate_key(key) == key
    assert len(sandbox_id(key)) == 16


@pytest.mark.parametrize(
    ("key", "message"),
    [("", "empty"), ("x" * 257, "257 bytes"), ("é" * 129, "258 bytes"), ("a\x00b", "NUL")],
)
def test_bad_keys(key: str, message: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        validate_key(key)
    assert message in str(info.value)


def test_sandbox_ids_differ() -> None:
    assert sandbox_id("a") != sandbox_id("b")
    assert sandbox_id("a") == sandbox_id("a")


def test_cap_text_keeps_head_and_tail() -> None:
    text = "HEAD" + "x" * 100_000 + "TAIL"
    capped, cut = cap_text(text, 1000)
    assert cut
    assert capped.startswith("HEAD")
    assert capped.endswith("TAIL")
    assert len(capped.encode()) <= 1000
    assert "bytes omitted" in capped


def test_cap_text_leaves_short_text_and_respects_utf8() -> None:
    assert cap_text("short", 100) == ("short", False)
    capped, cut = cap_text("é" * 10_000, 501)
    assert cut
    capped.encode("utf-8")  # no split characters
    assert len(capped.encode()) <= 501


@pytest.mark.parametrize(
    ("text", "limit"),
    [
        ("HEAD" + "x" * 100_000 + "TAIL", 1000),
        ("é" * 10_000, 501),
        ("a" * 10**6, 65536),
        ("€" * 999 + "z", 300),
        ("x" * 1000, 10),
        ("x" * 1000, 1),
    ],
)
def test_cap_text_says_how_much_it_left_out_and_stays_within(text: str, limit: int) -> None:
    capped, cut = cap_text(text, limit)
    assert cut
    assert len(capped.encode()) <= limit
    shown = re.search(r"\[\.\.\. (\d+) bytes omitted \.\.\.\]", capped)
    kept = capped.encode()
    if shown is not None:
        kept = kept.replace(shown.group(0).encode(), b"").replace(b"\n", b"")
        assert int(shown.group(1)) == len(text.encode()) - len(kept)
    else:
        assert text.encode().startswith(kept)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("", {}), ("  ", {}), ('{"a": 1}', {"a": 1})],
)
def test_parse_arguments(raw: str, expected: dict[str, int]) -> None:
    assert parse_arguments(raw) == expected


def test_parse_arguments_up_to_the_limits() -> None:
    assert parse_arguments('{"a": ' + "[" * 63 + "]" * 63 + "}")
    assert len(parse_arguments('{"a": [' + "0," * 9997 + "0]}")["a"]) == 9998  # 10000 values


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("{", "not valid JSON"),
        ("[1]", "must be a JSON object, got an array"),
        ("3", "got an integer"),
        ("null", "got null"),
        ('"x"', "got a string"),
        ("true", "got a boolean"),
        ('{"a": ' + "[" * 64 + "]" * 64 + "}", "nests deeper than 64 levels"),
        ('{"a": [' + "0," * 9998 + "0]}", "holds more than 10000 values"),
        ("{" + ", ".join(f'"k{i}": {{}}' for i in range(10_000)) + "}", "more than 10000 values"),
    ],
)
def test_parse_arguments_rejects(raw: str, message: str) -> None:
    with pytest.raises(ValueError, match="arguments_json") as info:
        parse_arguments(raw)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("data", "code", "message"),
    [
        ({"exit_code": 0}, "NONE", ""),
        ({"exit_code": 2}, "EXECUTION_FAILED", "exited with code 2"),
        ({"exit_code": 137, "signal": "SIGKILL"}, "EXECUTION_FAILED", "137 (SIGKILL)"),
        ({"timed_out": True, "exit_code": 137, "duration_ms": 5}, "TIMEOUT", "timed out"),
        ({}, "EXECUTION_FAILED", "no exit code"),
        ({"exit_code": "0"}, "EXECUTION_FAILED", "no exit code"),
    ],
)
def test_exec_outcome(data: dict[str, object], code: str, message: str) -> None:
    got_code, got_message = _exec_outcome(data)
    assert got_code.value == code
    assert message in got_message


def test_render_exec_and_lists() -> None:
    text = render("exec", {"stdout": "a\n", "stderr": "b\n", "exit_code": 1})
    assert text == "a\n\n[stderr]\nb\n\n[exit code 1]"
    entries = [{"name": "d", "is_dir": True}, {"name": "f", "is_dir": False, "size": 3}]
    assert render("list_files", {"entries": entries}) == "d/\nf  (3 bytes)"
    assert render("search", {"matches": []}) == "[no matches]"
    assert render("exec", {"stdout": "", "exit_code": 0}) == "[no output]"


def test_printable_escapes_what_would_act_on_a_terminal() -> None:
    assert printable("plain key é 🔑 a b") == "plain key é 🔑 a b"
    assert printable("a\nKEY  RUNNING") == "a\\nKEY  RUNNING"
    assert printable("\x1b[2J\rx\t\x00\u202eevil") == "\\x1b[2J\\rx\\t\\x00\\u202eevil"
