"""The snapshot commands: their arguments, and what they print (and exit with) against a
stand-in SandboxService driven through the real client."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from stockade.supervisor.cli.main import main, parse
from stockade.supervisor.cli.parsing import command_parser
from stockade.supervisor.cli.snapshots import size
from tests.unit.fake_snapshots import FakeSandboxService, serving


@pytest.mark.parametrize(
    ("argv", "key", "name", "tmp"),
    [
        (["snapshot", "demo"], "demo", "", False),
        (["snapshot", "demo", "before"], "demo", "before", False),
        (["snapshot", "demo", "before", "--tmp"], "demo", "before", True),
        (["snapshot", "--tmp", "demo"], "demo", "", True),
    ],
)
def test_snapshot_takes_a_key_an_optional_name_and_tmp(
    argv: list[str], key: str, name: str, tmp: bool
) -> None:
    ns = parse(argv)
    assert (ns.command, ns.key, ns.name, ns.tmp) == ("snapshot", key, name, tmp)


def test_the_other_commands_arguments() -> None:
    listing = parse(["snapshots"])
    assert (listing.key, listing.json) == ("", False)
    listing = parse(["snapshots", "--key", "demo", "--json"])
    assert (listing.key, listing.json) == ("demo", True)
    assert parse(["snapshot-rm", "before"]).name == "before"
    restore = parse(["restore", "demo", "before"])
    assert (restore.key, restore.snapshot) == ("demo", "before")
    fork = parse(["fork", "demo", "a", "b", "--tmp"])
    assert (fork.source, fork.new_keys, fork.tmp) == ("demo", ["a", "b"], True)
    assert parse(["fork", "--server", "unix:/s", "demo", "a"]).server == "unix:/s"


@pytest.mark.parametrize(
    "argv",
    [
        ["snapshot"],
        ["snapshot", "demo", "name", "extra"],
        ["snapshots", "demo"],
        ["snapshot-rm"],
        ["restore", "demo"],
        ["fork", "demo"],
        ["snapshot", "demo", "--memory"],
    ],
)
def test_wrong_arguments_exit_2_with_usage(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        parse(argv)
    assert caught.value.code == 2
    assert "usage: stockade" in capsys.readouterr().err


def test_the_help_lists_the_five_commands() -> None:
    text = command_parser().format_help()
    for line in (
        "snapshot            snapshot a sandbox's files",
        "snapshots           list the snapshots and the quota they use",
        "snapshot-rm         delete a snapshot",
        "restore             replace a sandbox's files with a snapshot's",
        "fork                new sandboxes with a sandbox's files as they are now",
    ):
        assert line in text


@pytest.mark.parametrize(
    ("n", "shown"),
    [(0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1536, "1.5 KiB"),
     (10 << 20, "10.0 MiB"), (10 << 30, "10.0 GiB"), (3 << 40, "3.0 TiB")],
)  # fmt: skip
def test_sizes_for_people(n: int, shown: str) -> None:
    assert size(n) == shown


@pytest.fixture
def service() -> Iterator[tuple[FakeSandboxService, str]]:
    with serving() as served:
        yield served


def run(target: str, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main([argv[0], "--server", target, *argv[1:]])
    out, err = capsys.readouterr()
    return code, out, err


def test_snapshot_prints_what_it_holds_and_the_frozen_time(
    service: tuple[FakeSandboxService, str], capsys: pytest.CaptureFixture[str]
) -> None:
    fake, target = service
    assert run(target, capsys, "snapshot", "demo", "before", "--tmp") == (
        0,
        "before: 3 files, 4.0 KiB, with /tmp; frozen 12 ms (2 files read frozen)\n"
        "  not captured (not a file, folder or link): run/app.sock\n"
        "  not captured (not a file, folder or link): fifo\n",
        "",
    )
    sent = fake.requests[-1]
    assert (sent.key, sent.name, sent.include_tmp, sent.include_memory) == (
        "demo", "before", True, False,
    )  # fmt: skip


def test_snapshot_names_ten_entries_not_captured_and_counts_the_rest(
    service: tuple[FakeSandboxService, str], capsys: pytest.CaptureFixture[str]
) -> None:
    _, target = service
    code, out, _ = run(target, capsys, "snapshot", "demo", "sockets")
    lines = out.splitlines()
    assert (code, len(lines)) == (0, 12)
    assert lines[10] == "  not captured (not a file, folder or link): s9.sock"
    assert lines[11] == "  ... and 2 more not captured"


def test_snapshots_prints_a_table_and_the_tenants_usage(
    service: tuple[FakeSandboxService, str], capsys: pytest.CaptureFixture[str]
) -> None:
    _, target = service
    code, out, _ = run(target, capsys, "snapshots")
    assert code == 0
    header, one, two, usage = out.splitlines()
    assert header.split() == ["NAME", "SOURCE", "CREATED", "FILES", "SIZE"]
    assert one.split()[:2] == ["one", "a"]
    assert one.split()[-3:] == ["3", "4.0", "KiB"]
    assert two.split()[:2] == ["two", "b"]
    assert usage == "tenant: 2 of 100 snapshots, 5.9 KiB of 10.0 GiB on disk"
    code, out, _ = run(target, capsys, "snapshots", "--key", "b", "--json")
    listing = json.loads(out)
    assert [s["name"] for s in listing["snapshots"]] == ["two"]
    assert listing["snapshots"][0]["created_at"] == "2026-11-25T20:01:02.123000+00:00"
    assert listing["snapshots"][0]["skipped"] == ["run/app.sock", "fifo"]
    assert {k: listing[k] for k in ("count", "bytes", "max_count", "max_bytes")} == {
        "count": 2, "bytes": 6000, "max_count": 100, "max_bytes": 10 << 30,
    }  # fmt: skip


def test_rm_restore_and_fork_say_what_they_did(
    service: tuple[FakeSandboxService, str], capsys: pytest.CaptureFixture[str]
) -> None:
    fake, target = service
    assert run(target, capsys, "snapshot-rm", "before") == (
        0,
        "before: deleted, 1.2 KiB freed\n",
        "",
    )
    assert run(target, capsys, "restore", "demo", "before") == (
        0, "demo: restored from before (3 files, 4.0 KiB, with /tmp); container c-demo\n", "",
    )  # fmt: skip
    assert run(target, capsys, "restore", "fresh", "before")[1] == (
        "fresh: created from before (3 files, 4.0 KiB, with /tmp); container c-fresh\n"
    )
    assert run(target, capsys, "fork", "demo", "f1", "f2") == (
        0,
        "f1: forked from demo; container c-f1\n"
        "f2: forked from demo; container c-f2\n"
        "capture: 3 files, 4.0 KiB, with /tmp; frozen 12 ms (2 files read frozen)\n",
        "",
    )
    assert list(fake.requests[-1].new_keys) == ["f1", "f2"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["snapshot", "demo", "taken"], "stockade: ALREADY_EXISTS: refused 'taken'\n"),
        (["snapshot-rm", "missing"], "stockade: NOT_FOUND: refused 'missing'\n"),
        (["restore", "demo", "missing"], "stockade: NOT_FOUND: refused 'missing'\n"),
        (["fork", "demo", "f1", "taken"], "stockade: ALREADY_EXISTS: refused 'taken'\n"),
        (["snapshot", "forbidden"], "stockade: PERMISSION_DENIED: refused 'forbidden'\n"),
    ],
)
def test_refusals_are_one_line_on_stderr_and_exit_2(
    service: tuple[FakeSandboxService, str],
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    _, target = service
    assert run(target, capsys, *argv) == (2, "", message)


def test_a_key_that_could_forge_lines_is_shown_escaped(
    service: tuple[FakeSandboxService, str], capsys: pytest.CaptureFixture[str]
) -> None:
    _, target = service
    code, out, _ = run(target, capsys, "fork", "demo", "x\nfake: forked\x1b[2J")
    assert code == 0
    assert out.splitlines()[0] == "x\\nfake: forked\\x1b[2J: forked from demo; container c-x"
