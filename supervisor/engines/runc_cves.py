"""Does this runc carry the fixes for the container-escape CVEs the isolation report names?

Versions are compared as Debian compares them (`dpkg --compare-versions`), which also orders
upstream runc versions once their "-rcN" is written "~rcN". Debian backports fixes into old
upstream versions, so a Debian package is judged by its full version against the version
Debian's advisories name; an upstream build by its upstream version alone.
"""

from __future__ import annotations

from dataclasses import dataclass

FIXED = "fixed"
VULNERABLE = "vulnerable"
UNKNOWN = "unknown"
NOT_APPLICABLE = "not_applicable"


@dataclass(frozen=True)
class CveStatus:
    id: str
    verdict: str
    """fixed, vulnerable, unknown or not_applicable."""
    reason: str


@dataclass(frozen=True)
class Fix:
    cve: str
    upstream: str
    """The first upstream runc release with the fix, in Debian notation."""
    debian: dict[str, tuple[str, str]]
    """Debian's upstream version string -> (first fixed package version, advisory)."""


FIXES = (
    # Upstream: fixed after 1.0.0-rc6 (the memfd re-exec of /proc/self/exe), released in rc7.
    # Debian's backport into its 1.0.0~rc6 packages is not in this table (not verified), so
    # those are reported as unknown rather than guessed.
    Fix("CVE-2019-5736", "1.0.0~rc7", {}),
    # Upstream: 1.1.12. Debian: DSA-5615-1 (bullseye, bookworm), DLA-3735-1 (buster).
    Fix(
        "CVE-2024-21626",
        "1.1.12",
        {
            "1.1.5+ds1": ("1.1.5+ds1-1+deb12u1", "DSA-5615-1, bookworm"),
            "1.0.0~rc93+ds1": ("1.0.0~rc93+ds1-5+deb11u3", "DSA-5615-1, bullseye"),
            "1.0.0~rc6+dfsg1": ("1.0.0~rc6+dfsg1-3+deb10u3", "DLA-3735-1, buster"),
        },
    ),
)


def assess(runtime: str, version: str, package_version: str) -> list[CveStatus]:
    """One status per CVE in FIXES. `version` is runc's own (e.g. "1.1.5+ds1" or
    "1.0.0-rc92"); `package_version` a Debian package version or ""."""
    return [_assess(fix, runtime, version, package_version) for fix in FIXES]


def _assess(fix: Fix, runtime: str, version: str, package_version: str) -> CveStatus:
    def status(verdict: str, reason: str) -> CveStatus:
        return CveStatus(fix.cve, verdict, reason)

    if "runc" not in runtime.lower():
        return status(NOT_APPLICABLE, f"the runtime is {runtime or 'unknown'}, not runc")
    if package_version:
        upstream = split_version(package_version)[1]
        if compare_versions(upstream, fix.upstream) >= 0:
            return status(
                FIXED, f"package {package_version}: upstream {upstream} >= {fix.upstream}"
            )
        if upstream in fix.debian:
            fixed, advisory = fix.debian[upstream]
            if compare_versions(package_version, fixed) >= 0:
                return status(FIXED, f"package {package_version} >= {fixed} ({advisory})")
            return status(VULNERABLE, f"package {package_version} < {fixed} ({advisory})")
        return status(
            UNKNOWN,
            f"package {package_version}: upstream {upstream} < {fix.upstream} and no known "
            "distribution fix for it; check the distribution's security tracker",
        )
    if not version:
        return status(UNKNOWN, "the runtime's version is unknown")
    upstream = upstream_version(version)
    if compare_versions(upstream, fix.upstream) >= 0:
        return status(FIXED, f"runc {version} >= {fix.upstream.replace('~', '-')}")
    return status(VULNERABLE, f"runc {version} < {fix.upstream.replace('~', '-')}")


def upstream_version(version: str) -> str:
    """runc's own version in Debian notation: "1.0.0-rc6" -> "1.0.0~rc6"."""
    return version.strip().removeprefix("v").replace("-", "~")


def split_version(version: str) -> tuple[int, str, str]:
    """(epoch, upstream, revision) of a Debian version."""
    text = version.strip()
    epoch, _, rest = text.partition(":") if ":" in text else ("0", "", text)
    upstream, _, revision = rest.rpartition("-") if "-" in rest else (rest, "", "")
    return int(epoch) if epoch.isdigit() else 0, upstream, revision


def compare_versions(a: str, b: str) -> int:
    """<0, 0 or >0 as `dpkg --compare-versions a lt|eq|gt b`."""
    ea, ua, ra = split_version(a)
    eb, ub, rb = split_version(b)
    if ea != eb:
        return ea - eb
    return _verrevcmp(ua, ub) or _verrevcmp(ra, rb)


def _order(c: str) -> int:
    if c == "~":
        return -1
    if c.isdigit():
        return 0
    if c.isalpha():
        return ord(c)
    return ord(c) + 256


def _verrevcmp(a: str, b: str) -> int:
    i = j = 0
    while i < len(a) or j < len(b):
        while (i < len(a) and not a[i].isdigit()) or (j < len(b) and not b[j].isdigit()):
            ac = _order(a[i]) if i < len(a) else 0
            bc = _order(b[j]) if j < len(b) else 0
            if ac != bc:
                return ac - bc
            i, j = i + 1, j + 1
        while i < len(a) and a[i] == "0":
            i += 1
        while j < len(b) and b[j] == "0":
            j += 1
        first_diff = 0
        while i < len(a) and a[i].isdigit() and j < len(b) and b[j].isdigit():
            first_diff = first_diff or ord(a[i]) - ord(b[j])
            i, j = i + 1, j + 1
        if i < len(a) and a[i].isdigit():
            return 1
        if j < len(b) and b[j].isdigit():
            return -1
        if first_diff:
            return first_diff
    return 0
