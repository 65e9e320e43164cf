"""stockade-drop, the launcher every sandbox command starts through, built on the host with
the image build's own command line and run with wrong, huge and hostile arguments. As root
here, it can set any ids, so the ids it ends with are checked, not only its refusals."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from stockade.agent import spawn
from stockade.supervisor.engines.image import REPO

SOURCE = REPO / "sandbox_image" / "drop" / "drop.c"


@pytest.fixture(scope="module")
def open_dir() -> Iterator[Path]:
    """A folder every uid may enter (pytest's own are root's, mode 0700)."""
    folder = Path(tempfile.mkdtemp(prefix="stockade-drop-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder)


@pytest.fixture(scope="module")
def drop(open_dir: Path) -> Path:
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is missing (scripts/setup.sh test installs it)")
    containerfile = (REPO / "sandbox_image" / "Containerfile").read_text()
    flags = re.search(r"gcc (-O2 [^\n\\]*)\\\n\s*-o /tmp/stockade-drop", containerfile)
    assert flags is not None, "the Containerfile's gcc line moved"
    binary = open_dir / "stockade-drop"
    subprocess.run([gcc, *flags.group(1).split(), "-o", str(binary), str(SOURCE)], check=True)
    return binary


def run(drop: Path, *args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(drop), *args], capture_output=True, text=True, timeout=30, **kwargs)  # type: ignore[call-overload, no-any-return]


def test_sets_all_ids_then_runs_the_program(drop: Path, open_dir: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("setting other ids needs root")
    status = "grep -E '^(Uid|Gid|Groups):' /proc/self/status; pwd"
    done = run(drop, "65532", "65531", str(open_dir), "-", "/bin/sh", "-c", status)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split()[1:] == ["65532"] * 4
    assert lines[1].split()[1:] == ["65531"] * 4
    assert lines[3] == str(open_dir)


def test_leaves_sigxfsz_ignored_only_when_asked(drop: Path) -> None:
    mask = 1 << (signal.SIGXFSZ - 1)
    for flags, ignored in (("x", True), ("-", False)):
        done = run(drop, "0", "0", "-", flags, "/bin/grep", "SigIgn", "/proc/self/status")
        assert bool(int(done.stdout.split()[1], 16) & mask) is ignored, flags


def test_environment_and_arguments_pass_unchanged(drop: Path) -> None:
    odd = ["", " ", "a\nb", "-x", "é", "x" * 100_000]
    done = run(drop, "0", "0", "-", "-", "/usr/bin/env", "--null", env={"A": "1", "B": "\n"})
    assert done.stdout.split("\0")[:2] == ["A=1", "B=\n"]
    printed = run(drop, "0", "0", "-", "-", "/usr/bin/printf", "%s\\0", *odd)
    assert printed.stdout.split("\0")[:-1] == odd


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        ((), 126, "usage"),
        (("1", "1", "-", "-"), 126, "usage"),
        (("", "1", "-", "-", "/bin/true"), 126, "empty id"),
        (("abc", "1", "-", "-", "/bin/true"), 126, "bad id: abc"),
        (("1", "-1", "-", "-", "/bin/true"), 126, "bad id: -1"),
        (("4294967295", "1", "-", "-", "/bin/true"), 126, "bad id: 4294967295"),
        (("99999999999999999999999", "1", "-", "-", "/bin/true"), 126, "bad id"),
        (("1 ", "1", "-", "-", "/bin/true"), 126, "bad id"),
        (("0", "0", "/nonexistent/x", "-", "/bin/true"), 126, "cannot change to folder"),
        (("0", "0", "-", "-", "/nonexistent"), 127, "cannot execute /nonexistent"),
        (("0", "0", "-", "-", "true"), 127, "cannot execute true"),  # no PATH lookup
        (("0", "0", "-", "-", "/etc"), 127, "cannot execute /etc"),
    ],
)
def test_refuses_bad_arguments_with_a_reason(
    drop: Path, args: tuple[str, ...], status: int, message: str
) -> None:
    done = run(drop, *args)
    assert done.returncode == status
    assert done.stderr.startswith("stockade-drop: ")
    assert message in done.stderr


def test_without_privilege_it_cannot_take_other_ids(drop: Path) -> None:
    """Only ids the caller already has can be set: from nobody, root's are refused."""
    if os.geteuid() != 0:
        pytest.skip("needs root to become nobody first")
    done = run(drop, "65534", "65534", "-", "-", str(drop), "0", "0", "-", "-", "/bin/true")
    assert done.returncode == 126
    assert "setresgid failed for 0" in done.stderr


def test_command_argv_routes_through_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(spawn, "_sandbox_ids", None)
    here = Path(os.getcwd())
    assert spawn.command_argv(["/bin/sh", "-c", "x"], here) == ["/bin/sh", "-c", "x"]
    assert spawn.command_argv(["a"], tmp_path, ignore_xfsz=True) == [
        spawn.ENV,
        f"--chdir={tmp_path}",
        "--ignore-signal=XFSZ",
        "a",
    ]
    monkeypatch.setattr(spawn, "_sandbox_ids", (65532, 65531))
    assert spawn.command_argv(["/bin/sh", "-c", "x"], here) == [
        spawn.DROP,
        "65532",
        "65531",
        "-",
        "-",
        "/bin/sh",
        "-c",
        "x",
    ]
    assert spawn.command_argv(["sh", "y"], tmp_path, ignore_xfsz=True) == [
        spawn.DROP,
        "65532",
        "65531",
        str(tmp_path),
        "x",
        shutil.which("sh"),
        "y",
    ]


def test_the_agents_user_argument() -> None:
    from stockade.agent import identity

    with pytest.raises(ValueError, match="UID:GID in digits"):
        identity.parse("sandbox")
    assert identity.parse("65532:65531") == (65532, 65531)
    assert identity.parse("7") == (7, 7)
