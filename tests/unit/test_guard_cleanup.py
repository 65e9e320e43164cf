"""The command guard and routine cleanup (issue 13): recursive removal below the workspace
root is allowed; the root itself, what is above it, system folders and every path the guard
cannot pin down are denied, wherever the command runs (workdir, cd, env)."""

from __future__ import annotations

import pytest

from stockade.supervisor.policy.guard import Guard, GuardConfigError, GuardRule

GUARD = Guard()


def _id(command: str) -> str:
    return command.replace("\n", "\\n")[:60]


CLEANUPS = [
    "rm -rf build/",
    "rm -rf ./node_modules",
    "rm -rf /workspace/dist",
    "rm -rf build dist *.egg-info .pytest_cache",
    "rm -rf build/*",
    "rm -rf packages/*/dist",
    "rm -rf ~/.cache/pip",
    'rm -rf "$HOME/.npm"',
    'rm -rf "$(pwd)/build"',
    "rm -rf /tmp/build-1",
    "rm -rf /workspace/../workspace/build",
    "cd build && rm -rf *",
    "mkdir -p build && cd build && rm -rf * && cmake ..",
    "cd web && rm -rf dist && cd .. && rm -rf build",
    "cd build && bash -c 'rm -rf *'",
    "find build -delete",
    "find . -name '*.pyc' -delete",
    "find . -name __pycache__ -type d -exec rm -rf {} +",
    "find build -exec rm -rf {} +",
    "find . \\( -name '*.pyc' -o -name '*.pyo' \\) -delete",
    "find -H . -name '*.tmp' -delete",
    "rsync -a --delete src/ build/src/",
    "trap 'rm -f /tmp/lock' EXIT; rm -rf build",
    "python3 -c \"import shutil; shutil.rmtree('build')\"",
    "dd if=in.bin of=out.bin",
    "dd if=/dev/zero of=big.bin bs=1M count=10",
    "dd if=/dev/urandom of=/tmp/r bs=1k count=1",
]


@pytest.mark.parametrize("command", CLEANUPS, ids=_id)
def test_routine_cleanup_is_allowed(command: str) -> None:
    result = GUARD.check(command)
    assert result.action == "allow", result.reason


REFUSED = [
    # the workspace root (the default working directory) and above it
    ("rm -rf .", "destructive-rm", "the workspace root (/workspace)"),
    ("rm -rf *", "destructive-rm", "a glob that can match everything in /workspace"),
    ("rm -rf .*", "destructive-rm", "a glob that can match everything in /workspace"),
    ("rm -rf ./*", "destructive-rm", "a glob that can match everything in /workspace"),
    ("rm -rf /workspace/*", "destructive-rm", "match everything in /workspace"),
    ("rm -rf [!.]*", "destructive-rm", "match everything in /workspace"),
    ("rm -rf *e*", "destructive-rm", "match everything in /workspace"),
    ("rm -rf /workspace", "destructive-rm", "the workspace root"),
    ("rm -rf build/..", "destructive-rm", "the workspace root"),
    ("rm -rf build/../..", "destructive-rm", "the workspace root or a folder above it (/)"),
    ("rm -rf ../x", "destructive-rm", "a path outside the workspace (/x)"),
    ("rm -rf $PWD", "destructive-rm", "the workspace root"),
    ("rm -rf ~", "destructive-rm", "the home or temporary directory itself (/tmp)"),
    ("rm -rf /tmp/*", "destructive-rm", "match everything in /tmp"),
    ("rm -rf /opt/app", "destructive-rm", "a path outside the workspace (/opt/app)"),
    # what the guard cannot know
    ('rm -rf -- "$DIR"', "destructive-rm", "a path known only at run time ($DIR)"),
    ("rm -rf $(ls)", "destructive-rm", "known only at run time"),
    ("rm -rf build-$V", "destructive-rm", "known only at run time"),
    ("xargs rm -rf < dirs", "destructive-rm", "paths read at run time"),
    ("find . -name x | xargs rm -rf", "destructive-rm", "paths read at run time"),
    ("xargs -I{} rm -rf {}", "destructive-rm", "paths read at run time"),
    # find
    ("find . -delete", "destructive-find", "the workspace root (/workspace) with no name test"),
    ("find /workspace -type f -delete", "destructive-find", "with no name test"),
    ("find . -exec rm -rf {} +", "destructive-rm", "the workspace root"),
    ("find . -mindepth 1 -exec rm -rf {} +", "destructive-rm", "match everything in /workspace"),
    ("find / -name '*.log' -delete", "destructive-find", "a folder above it (/)"),
    ("find / -name x -exec rm -rf {} +", "destructive-rm", "outside the workspace"),
    ("python3 -c \"import shutil; shutil.rmtree('.')\"", "destructive-rm", "workspace root"),
    ("find . -regex '.*' -delete", "destructive-find", "with no name test narrowing it"),
    ("find . -path './*' -delete", "destructive-find", "with no name test narrowing it"),
    ("find . -name x -o -delete", "destructive-find", "with no name test narrowing it"),
    ("find . ! -name keep -delete", "destructive-find", "with no name test narrowing it"),
    ("find . \\( -name x -o -type f \\) -delete", "destructive-find", "no name test narrowing it"),
    ("find . -mtime +30 -delete", "destructive-find", "with no name test narrowing it"),
    ("find -L / -name x -delete", "destructive-find", "a folder above it (/)"),
    ("find -O3 / -name x -delete", "destructive-find", "a folder above it (/)"),
    ("rm -rf ~root", "destructive-rm", "another user's home directory"),
    ("rsync -a --delete empty/ ./", "destructive-rm", "rsync --delete into the workspace root"),
    # dd
    ("dd of=/dev/sda", "raw-disk-write", "raw disk"),
    ("dd if=/dev/sda of=disk.img", "dd-copy", "dd reading a device"),
    ("dd if=/dev/mem of=m", "dd-copy", "dd reading a device or kernel memory"),
    ("dd if=x of=/dev/tty1", "dd-copy", "dd writing a device"),
    ("dd if=x of=/etc/passwd", "dd-copy", "dd writing a path outside the workspace"),
    ("cd / && dd if=/dev/zero of=etc/x", "dd-copy", "outside the workspace (/etc/x)"),
    ("dd if=/dev/zero of=~/../etc/x", "dd-copy", "outside the workspace (/etc/x)"),
    ("cd /dev && dd if=sda of=x", "dd-copy", "dd reading a device or kernel memory (sda)"),
    ("dd if=$SRC of=out.bin", "dd-copy", "known only at run time"),
]


@pytest.mark.parametrize(("command", "rule", "why"), REFUSED, ids=_id)
def test_the_root_and_beyond_stay_refused(command: str, rule: str, why: str) -> None:
    result = GUARD.check(command)
    assert (result.action, result.rule) == ("deny", rule), result.reason
    assert why in result.reason


CD = [
    ("cd build; rm -rf *", "cd may fail: then * is the workspace root's"),
    ("cd build || true; rm -rf *", "cd may fail"),
    ("(cd build && make); rm -rf *", "a subshell's cd does not last"),
    ("cd build | cat; rm -rf *", "a pipeline stage's cd does not last"),
    ("x=$(cd build); rm -rf *", "a substitution's cd does not last"),
    ("cd build & rm -rf *", "a background cd does not last"),
    ("cd src && cd .. && rm -rf *", "back at the root"),
    ("cd / && rm -rf etc", "cd to /"),
    ("cd && rm -rf *", "cd to $HOME"),
    ("cd ~ && rm -rf .cache/..", "cd to $HOME"),
    ("command cd / && rm -rf etc", "cd through builtin/command"),
    ("builtin cd /etc && rm -rf ./*", "cd through builtin/command"),
    ("time -p cd / && rm -rf etc", "cd after the time keyword"),
    ('cd "$D" && rm -rf build', "cd to a run-time value"),
    ("cd - && rm -rf build", "cd -"),
    ("pushd / && rm -rf etc", "pushd"),
    ("pushd build && popd && rm -rf x", "popd: unknown"),
    ("for i in 1 2; do cd ..; done; rm -rf x", "a cd in a loop"),
    ("for i in 1 2; do rm -rf x; cd ..; done", "a cd in a loop, before it on the next pass"),
    ("f() { cd /; }; f; rm -rf etc", "a function that changes directory"),
    ("eval 'cd /'; rm -rf etc", "eval may change directory"),
    (". ./env.sh; rm -rf build", "source may change directory"),
    ("CDPATH=/; cd etc && rm -rf *", "CDPATH makes cd NAME go anywhere"),
    ("export CDPATH=/ && cd etc && rm -rf ./*", "CDPATH"),
    ("CDPATH=/ sh -c 'cd etc && rm -rf *'", "CDPATH in the outer command"),
    ("cd / && sh -c 'rm -rf etc'", "a nested shell starts where it runs"),
    ("cd / && echo 'rm -rf etc' | sh", "a nested shell starts where it runs"),
    ("cd / && find etc -delete", "find in /etc"),
    ("cd / && python3 -c \"import shutil; shutil.rmtree('etc')\"", "inline code runs there too"),
    ("HOME=/; rm -rf ~/etc", "HOME changed"),
    ("export HOME=/ && rm -rf ~/etc", "HOME changed"),
    ("alias go='cd /'; go; rm -rf etc", "an alias for cd"),
    ("trap 'cd /' DEBUG; rm -rf etc", "a trap that changes directory"),
]


@pytest.mark.parametrize(("command", "why"), CD, ids=_id)
def test_the_directory_a_command_runs_in_is_followed(command: str, why: str) -> None:
    result = GUARD.check(command)
    assert result.action == "deny", why
    assert result.rule in ("destructive-rm", "destructive-find"), result.reason


def test_the_workdir_of_the_call_is_where_commands_start() -> None:
    assert GUARD.check("rm -rf *", workdir="sub").action == "allow"
    assert GUARD.check("rm -rf ..", workdir="sub").action == "deny"
    assert GUARD.check("rm -rf ../*", workdir="sub").action == "deny"
    assert GUARD.check("rm -rf .", workdir="sub/deeper").action == "allow"
    assert GUARD.check("rm -rf *", workdir="/workspace/sub").action == "allow"
    assert GUARD.check("rm -rf etc", workdir="/").action == "deny"
    assert GUARD.check("rm -rf etc", workdir="sub/../..").action == "deny"
    assert GUARD.check("rm -rf *", workdir=".").action == "deny"


def test_an_unknown_workdir_refuses_relative_removals_only() -> None:
    assert GUARD.check("rm -rf build", workdir=None).action == "deny"
    assert GUARD.check("rm -rf /workspace/build", workdir=None).action == "allow"
    assert GUARD.check("ls", workdir=None).action == "allow"


def test_an_env_that_sets_home_or_cdpath_makes_them_unknown() -> None:
    assert GUARD.check("rm -rf ~/x").action == "allow"
    assert GUARD.check("rm -rf ~/x", env={"HOME": "/"}).action == "deny"
    assert GUARD.check('rm -rf "$HOME/x"', env={"HOME": "/"}).action == "deny"
    assert GUARD.check("cd etc && rm -rf *").action == "allow"  # /workspace/etc/*
    assert GUARD.check("cd etc && rm -rf *", env={"CDPATH": "/"}).action == "deny"
    assert GUARD.check("cd ./etc && rm -rf *", env={"CDPATH": "/"}).action == "allow"
    assert GUARD.check("rm -rf build", env={"PATH": "/x"}).action == "allow"


def test_a_literal_home_in_the_workspace_or_tmp_is_known() -> None:
    """E2B's calls set HOME=/home/user (the image's link to the workspace)."""
    e2b = {"HOME": "/home/user"}
    assert GUARD.check("rm -rf ~/build", env=e2b).action == "allow"
    assert GUARD.check('rm -rf "$HOME/.cache"', env=e2b).action == "allow"
    assert GUARD.check("rm -rf ~", env=e2b).action == "deny"  # the workspace root
    assert GUARD.check("rm -rf ~/*", env=e2b).action == "deny"
    assert GUARD.check("rm -rf ~/x", env={"HOME": "/tmp/h"}).action == "allow"
    for home in ("/etc", "/home/other", "$X", "relative", "/home/user/../../etc"):
        assert GUARD.check("rm -rf ~/x", env={"HOME": home}).action == "deny", home


def test_the_images_home_link_is_the_workspace() -> None:
    assert GUARD.check("rm -rf /home/user/build").action == "allow"
    assert GUARD.check("cd /home/user && rm -rf dist").action == "allow"
    for command in ("rm -rf /home/user", "rm -rf /home/user/*", "rm -rf /home/user/.."):
        assert GUARD.check(command).action == "deny", command
    assert GUARD.check("rm -rf /home/other/x").action == "deny"
    assert GUARD.check("rm -rf /home").action == "deny"


def test_the_workspace_and_home_are_configurable() -> None:
    guard = Guard(workspace="/srv/ws", home="/home/agent")
    assert guard.check("rm -rf /srv/ws/build").action == "allow"
    assert guard.check("rm -rf build").action == "allow"
    assert guard.check("rm -rf ~/.cache").action == "allow"
    assert guard.check("rm -rf /srv/ws").action == "deny"
    assert guard.check("rm -rf *").action == "deny"
    assert guard.check("rm -rf ~").action == "deny"
    assert guard.check("rm -rf /workspace/build").action == "deny"


@pytest.mark.parametrize(
    "kwargs",
    [{"workspace": "workspace"}, {"workspace": "/"}, {"home": "/"}, {"home": "//."}, {"home": 3}],
)
def test_bad_workspace_or_home_fail_at_construction(kwargs: dict[str, object]) -> None:
    with pytest.raises(GuardConfigError, match="absolute folder other than /"):
        Guard(**kwargs)  # type: ignore[arg-type]


def test_a_config_rule_can_bring_back_the_old_strictness() -> None:
    """``[[guard.rules]]`` deny rules still add to the built-ins (configurable as before)."""
    strict = Guard([GuardRule("no-recursive-rm", r"^rm\s+(-\S*[rR]|--rec)", "no rm -r here")])
    result = strict.check("cd build && rm -rf dist")
    assert (result.action, result.rule, result.reason) == (
        "deny",
        "no-recursive-rm",
        ("no rm -r here is blocked by rule no-recursive-rm"),
    )
    assert strict.check("rm build/x.o").action == "allow"
    assert Guard(on_parse_error="ask").check("rm -rf build )(").action == "ask"


WRAPPED_DIRS = [
    "env -C / rm -rf etc",
    "env --chdir=/ rm -rf etc",
    "env -u X -C/ rm -rf etc",
    "env -C / sh -c 'rm -rf etc'",
    "systemd-run --working-directory=/ rm -rf etc",
    "unshare -w / rm -rf etc",
    'env -C "$D" rm -rf build',
    # the wrapped command's own -C is not the wrapper's
    "cd / && env sh -c 'rm -rf etc' -C /workspace/x",
]


@pytest.mark.parametrize("command", WRAPPED_DIRS, ids=_id)
def test_a_wrapper_that_changes_directory_is_followed(command: str) -> None:
    result = GUARD.check(command)
    assert (result.action, result.rule) == ("deny", "destructive-rm"), result.reason
    assert GUARD.check("env -C build rm -rf *").action == "allow"


LINKED = [
    "ln -s / root; rm -rf root/*",
    "ln -sf /etc e && rm -rf e/",
    "ln -s /etc && rm -rf etc/ssl",
    "mkdir x && cd x && ln -s / r && cd .. && rm -rf x/r/etc",
    "ln -s / r; rm -rf r*/etc",
    "ln -s / r; sh -c 'rm -rf r/*'",
]


@pytest.mark.parametrize("command", LINKED, ids=_id)
def test_a_removal_through_a_symlink_the_command_makes_is_refused(command: str) -> None:
    result = GUARD.check(command)
    assert (result.action, result.rule) == ("deny", "destructive-rm"), result.reason
    assert "symlink the command makes" in result.reason


def test_symlinks_made_before_the_command_are_not_known() -> None:
    """The guard cannot see the file system: the container is the boundary there."""
    assert GUARD.check("rm -rf root/*").action == "allow"
    assert GUARD.check("ln -sf ../shared/c.json c.json && rm -rf build").action == "allow"
