"""The sandbox seccomp profile: the engine's default with namespace creation shut."""

from __future__ import annotations

import json
from pathlib import Path

from stockade.supervisor.engines import seccomp

BASE = {
    "defaultAction": "SCMP_ACT_ERRNO",
    "defaultErrnoRet": 38,
    "syscalls": [
        {"names": ["read", "clone", "clone3", "unshare", "write"], "action": "SCMP_ACT_ALLOW"},
        {"names": ["clone"], "action": "SCMP_ACT_ALLOW", "includes": {"caps": ["CAP_SYS_ADMIN"]}},
    ],
}


def test_tighten_guards_clone_unshare_and_clone3() -> None:
    tight = seccomp.tighten(BASE)
    assert tight["defaultAction"] == "SCMP_ACT_ERRNO"
    rules = tight["syscalls"]
    assert rules[0] == {"names": ["read", "write"], "action": "SCMP_ACT_ALLOW"}
    assert len(rules) == 3  # the capability-only clone rule is gone with its last name
    guarded = {name: rule for rule in rules[1:] for name in rule["names"]}
    assert guarded["clone"]["args"] == [
        {"index": 0, "value": 0x7E020000, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}
    ]
    assert guarded["unshare"] is guarded["clone"]
    assert guarded["clone3"] == {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38}
    assert BASE["syscalls"][0]["names"][1] == "clone"  # the input is left alone


def test_gvisor_gets_clone3_allowed_and_the_same_namespace_rules() -> None:
    """gVisor's seccomp (runsc 20221219) ignores errnoRet: a refused clone3 would be EPERM,
    and glibc falls back to clone only on ENOSYS; that gVisor answers ENOSYS itself."""
    plain, gvisor = seccomp.tighten(BASE), seccomp.tighten(BASE, gvisor=True)
    assert gvisor["syscalls"][:-1] == plain["syscalls"][:-1]
    assert gvisor["syscalls"][-1] == {"names": ["clone3"], "action": "SCMP_ACT_ALLOW"}


def test_write_profile_uses_the_first_base_found(tmp_path: Path) -> None:
    base = tmp_path / "seccomp.json"
    base.write_text(json.dumps(BASE))
    target = tmp_path / "state" / "profile.json"
    assert seccomp.write_profile(target, (tmp_path / "missing.json", base)) == target
    assert json.loads(target.read_text()) == seccomp.tighten(BASE)


def test_no_base_profile_leaves_the_engine_default(tmp_path: Path) -> None:
    assert seccomp.write_profile(tmp_path / "p.json", (tmp_path / "none.json",)) is None
    assert not (tmp_path / "p.json").exists()
