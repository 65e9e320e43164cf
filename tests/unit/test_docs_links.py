"""The documentation stays inside the repository: every link in README.md and docs/*.md is
relative and resolves to a file of the repository (and an anchor, when given, to a heading of
that file); nothing points outside it (../shared, absolute paths, URLs); the README stays
short (at most 300 lines), the rest lives in docs/."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 300
REQUIRED_DOCS = (
    "architecture.md",
    "configuration.md",
    "policy.md",
    "security.md",
    "benchmarks.md",
    "limitations.md",
)

FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.M | re.S)
COMMENT = re.compile(r"<!--.*?-->", re.S)
CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", re.S)
INLINE_LINK = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]"  # the text, one level of brackets inside
    r"\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)"  # (target "title")
)
REFERENCE_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.M)
AUTOLINK = re.compile(r"<((?:[a-zA-Z][a-zA-Z0-9+.-]*):[^>\s]*)>")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.+?)[ \t#]*$", re.M)


def documents() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def prose(text: str) -> str:
    """The text where links count: no fenced code, no HTML comments, no code spans."""
    return CODE_SPAN.sub("", COMMENT.sub("", FENCE.sub("", text)))


def links(text: str) -> list[str]:
    body = prose(text)
    found = [m.group(1) for m in INLINE_LINK.finditer(body)]
    found += [m.group(1) for m in REFERENCE_DEF.finditer(body)]
    return found + [m.group(1) for m in AUTOLINK.finditer(body)]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed, spaces
    turned into hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.replace("`", "").replace("*", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out: set[str] = set()
    for match in HEADING.finditer(FENCE.sub("", path.read_text())):
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def problem(source: Path, target: str, root: Path = ROOT) -> str | None:
    """What is wrong with one link of `source`, or None when it resolves inside `root`."""
    if not target:
        return "an empty link"
    if SCHEME.match(target) or target.startswith("//"):
        return f"{target!r} leaves the repository"
    path_part, _, anchor = target.partition("#")
    if path_part.startswith("/"):
        return f"{target!r} is an absolute path"
    resolved = (source.parent / unquote(path_part)).resolve() if path_part else source
    if not resolved.is_relative_to(root):
        return f"{target!r} points outside the repository"
    if not resolved.is_file():
        return f"{target!r}: no such file in the repository"
    if anchor and resolved.suffix == ".md" and unquote(anchor) not in anchors(resolved):
        return f"{target!r}: no heading {anchor!r} in {resolved.relative_to(root)}"
    return None


@pytest.mark.parametrize("doc", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves_inside_the_repository(doc: Path) -> None:
    problems = [p for t in links(doc.read_text()) if (p := problem(doc, t)) is not None]
    assert not problems, f"{doc.relative_to(ROOT)}: " + "; ".join(problems)


def test_the_readme_is_short_and_the_docs_are_there() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines (at most {MAX_README_LINES})"
    missing = [name for name in REQUIRED_DOCS if not (DOCS / name).is_file()]
    assert not missing, f"docs/ lacks {', '.join(missing)}"


def test_the_readme_links_into_every_page_of_the_docs() -> None:
    linked = {
        (README.parent / t.partition("#")[0]).resolve()
        for t in links(README.read_text())
        if not SCHEME.match(t)
    }
    unlinked = [p.name for p in sorted(DOCS.glob("*.md")) if p.resolve() not in linked]
    assert not unlinked, f"README.md links to none of: {', '.join(unlinked)}"


@pytest.mark.parametrize(
    ("target", "wrong"),
    [
        ("docs/policy.md", None),
        ("docs/policy.md#guard", None),
        ("docs/policy.md#no-such-heading", "no heading"),
        ("docs/policy.md#not-a-heading", "no heading"),
        ("#two-commands", "no such file"),
        ("docs/nothing.md", "no such file"),
        ("../shared/STYLE.md", "outside the repository"),
        ("/etc/passwd", "absolute path"),
        ("https://example.com/x", "leaves the repository"),
        ("mailto:someone@example.com", "leaves the repository"),
        ("", "empty link"),
    ],
)
def test_the_checker_tells_good_links_from_bad(
    tmp_path: Path, target: str, wrong: str | None
) -> None:
    repo = tmp_path / "repo"
    (repo / "docs").mkdir(parents=True)
    (repo / "docs" / "policy.md").write_text("# Policy\n\n## Guard\n\n```\n## Not a heading\n```\n")
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "STYLE.md").write_text("outside\n")
    found = problem(repo / "README.md", target, root=repo)
    assert (found is None) if wrong is None else (found is not None and wrong in found)


def test_links_in_code_and_comments_do_not_count_and_others_do() -> None:
    text = (
        "[a](docs/a.md) `[b](docs/b.md)` <!-- [c](docs/c.md) -->\n"
        "```\n[d](docs/d.md)\n```\n"
        '[e]: docs/e.md\n<https://example.com>\n[`f`](docs/f.md#x "title")\n'
    )
    assert links(text) == ["docs/a.md", "docs/f.md#x", "docs/e.md", "https://example.com"]


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("Two commands (fresh Debian 12, as root)", "two-commands-fresh-debian-12-as-root"),
        ("`[engine]`", "engine"),
        ("`test_escapes.py`: escape attempts", "test_escapespy-escape-attempts"),
        ("Runtime, and gVisor", "runtime-and-gvisor"),
        ("The audit log's size", "the-audit-logs-size"),
    ],
)
def test_anchors_are_githubs(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor
