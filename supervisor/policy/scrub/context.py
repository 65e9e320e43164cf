"""The scrubber's rules that read a credential from its context rather than its shape: private
key blocks, passwords in URLs and on command lines, `Bearer` and `Cookie` headers, .netrc
entries, values after a keyword-named key (`GITHUB_TOKEN=x`), and XML elements named for a
secret. Each rule carries the Hyperscan pattern that finds where it may match (`anchor`) and
whether it is confirmed on that line or over the whole text (`scope`): see engine.py.
Imports nothing of the scrubber but the standard library."""

from __future__ import annotations

import re
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

_Span = tuple[int, int]


@dataclass(frozen=True)
class Rule:
    name: str
    pattern: re.Pattern[str]
    groups: tuple[str | int, ...] = (0,)
    """The parts of the match to redact (those that took part); the rest stays readable."""
    anchor: str = ""
    """What Hyperscan looks for: every match of `pattern` holds a match of it on its line."""
    scope: str = "line"
    """`line`: confirmed on the lines of the anchor's hits; `text`: over the whole text, once,
    when the anchor is found anywhere (rules that span lines)."""


_KEYWORDS = (
    "token",
    "secret",
    "password",
    "passwd",
    "passphrase",
    "bearer",
    "authorization",
    "key-data",  # kubeconfig client-key-data
    *(
        f"{name}{sep}key"
        for name in ("api", "access", "secret", "private", "account", "auth", "client", "master")
        for sep in ("", "_", "-")
    ),
)
"""A name ending in one of these labels a secret: `GITHUB_TOKEN`, `SecretAccessKey`."""
_SHORT_KEYWORDS = ("pwd", "auth")
"""Too short to match inside a word: only a whole name part counts (`DB_PWD`, not `OLDPWD`)."""
_EQUALS_KEYWORDS = ("pass", "sig")
"""Short keywords only before `=` (`DB_PASS=x`; `PASS: test_x` is a test runner's line), and
`sig` only right before it (`&sig=` in an Azure SAS URL, not `sig = signature(f)`)."""


def alternation(words: Iterable[str]) -> str:
    return "|".join(re.escape(word) for word in sorted(words, key=lambda w: (-len(w), w)))


_WORD_END = "\0"
"""In a `_caseless_trie` word: not followed by a letter."""


def _caseless_trie(words: Iterable[str]) -> str:
    """`words` as a regex trie that ignores ASCII case: the alternatives at each level
    start with different characters, so `re` drops a wrong one after one comparison
    (with re.IGNORECASE it would try every word in full)."""
    children: dict[str, list[str]] = {}
    for word in words:
        children.setdefault(word[:1].lower(), []).append(word[1:])
    ends = children.pop("", None) is not None
    branches = [_trie_char(c) + _caseless_trie(rest) for c, rest in sorted(children.items())]
    if not branches:
        return ""
    if len(branches) == 1 and not ends:
        return branches[0]
    return f"(?:{'|'.join(branches)})" + ("?" if ends else "")


def _trie_char(c: str) -> str:
    if c == _WORD_END:
        return "(?![A-Za-z])"
    return f"[{c.upper()}{c}]" if c.isalpha() else re.escape(c)


_PROSE = r"[A-Za-z]+(?:-[A-Za-z]+)*[,.;:!?]?[ \t]+[A-Za-z]"
"""A word followed by more words: `auth: fix the login`, `--password option, or...`,
`/etc/passwd': Read-only file system` (an error message, not a password)."""
_SCHEMES = r"(?i:bearer|basic|token|bot|digest|negotiate|ntlm|apikey|aws4-hmac-sha256)"
_ALL_KEYWORDS = (*_KEYWORDS, *_SHORT_KEYWORDS, *_EQUALS_KEYWORDS)
_ANY_KEYWORD = "(?:" + "|".join(re.escape(word) for word in _ALL_KEYWORDS) + ")"
"""For Hyperscan anchors, which are compiled caseless: any keyword, anywhere in a word."""
_NOT_URL = r"\s/?#@\[\]\"'<>"
RULES = (
    Rule(
        "pem-private-key",
        # A PEM body cannot contain `-----`, so a BEGIN without END costs one scan to the
        # next `-----`, and a truncated key is hidden to the end rather than shown.
        re.compile(
            r"--(?:---BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"
            r"[^-]*(?:-(?!----)[^-]*)*"
            r"(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----)?"
            r"|-- BEGIN SSH2 (?:ENCRYPTED )?PRIVATE KEY ----[^-]*(?:-(?!---)[^-]*)*"
            r"(?:---- END SSH2 (?:ENCRYPTED )?PRIVATE KEY ----)?)"
        ),
        anchor=r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY|---- BEGIN SSH2 ",
        scope="text",
    ),
    Rule(
        "cli-flag",
        re.compile(
            r"--(?<![\w-]--)(?:[A-Za-z0-9]+[-_])*"
            + _caseless_trie(_ALL_KEYWORDS)
            + r"[ \t]+(?:\"(?P<dq>[^\"\n]+)\"|'(?P<sq>[^'\n]+)'"
            + rf"|(?!{_PROSE})(?P<bare>[^\s\"'-]\S*))"
        ),
        ("dq", "sq", "bare"),
        anchor=rf"--[A-Za-z0-9_-]*{_ANY_KEYWORD}[ \t]",
    ),
    Rule(
        "url-password/slack-webhook",
        re.compile(
            r"://(?:hooks\.slack\.com/(?:services|workflows|triggers)/(?P<hook>[\w/-]+)"
            r"|(?:ptb\.|canary\.)?discord(?:app)?\.com/api/webhooks/(?P<discord>\d+/[\w-]{20,})"
            r"|[^\s:/?#@\[\]\"'<>]*:(?P<password>[^\s/?#@\[\]\"'<>]+(?:@[^\s/?#@\[\]\"'<>]+)*)@)",
            re.ASCII,
        ),
        ("hook", "discord", "password"),
        anchor=rf"://[^:{_NOT_URL}]*:[^{_NOT_URL}]+@|://hooks\.slack\.com/|discord(?:app)?\.com/",
    ),
    Rule(
        "bearer",
        re.compile(
            r"earer(?<=[Bb]earer|BEARER)(?<![\w-].earer)[ \t]+(?P<s>[\w.~+/-]{16,}=*)", re.ASCII
        ),
        ("s",),
        anchor=r"bearer[ \t]+[A-Za-z0-9_.~+/-]{16}",
    ),
    Rule(
        "putty-private-key",
        re.compile(
            r"Private-Lines:[ \t]*\d+\r?\n"
            r"(?P<s>[A-Za-z0-9+/=]+(?=\r?\n|$)(?:\r?\n[A-Za-z0-9+/=]+(?=\r?\n|$))*)"
        ),
        ("s",),
        anchor="Private-Lines:",
        scope="text",
    ),
    Rule(
        "cookie",
        re.compile(r"ookie:(?<=[Cc]ookie:)[ \t]*(?P<s>[^\s;][^\r\n]*)"),
        ("s",),
        anchor="cookie:",
    ),
    Rule(
        "cli-user",  # curl -u user:pass, --user user:pass; not docker's -u 1000:1000
        re.compile(
            r"-u(?<![\w]-u)(?:(?<=--u)ser[ \t=]+|[ \t]+)[\"']?[^\s:'\"]+:"
            r"(?![0-9]*(?:[\s'\"]|$))(?P<s>[^\s'\"]+)"
        ),
        ("s",),
        anchor=r"-u(?:ser[ \t=]+|[ \t]+)[^\s:]+:",
    ),
    Rule(
        "sshpass",
        re.compile(r"sshpass[ \t]+-p[ \t]*(?P<s>[^\s-]\S*)"),
        ("s",),
        anchor=r"sshpass[ \t]+-p",
    ),
    Rule(
        "mysql",  # mysql -u root -pSECRET
        re.compile(
            r"mysql(?:dump|admin)?(?:[ \t]+-(?!p)\S*(?:[ \t]+[^\s-]\S*)?){0,6}"
            r"[ \t]+-p(?P<s>[^\s-]\S*)"
        ),
        ("s",),
        anchor=r"mysql[^\n]*[ \t]-p[^\s-]",
    ),
    Rule(
        "netrc",
        re.compile(r"login(?<![\w-]login)\s+\S+\s+password\s+(?P<s>\S+)"),
        ("s",),
        anchor=r"login\s+\S+\s+password",
        scope="text",
    ),
    Rule(
        "netrc-line",  # `password P` ending its line: a .netrc over lines, seen line by line
        re.compile(
            "password(?:"
            + "|".join(
                f"(?<={start}{indent}password)"
                for start in ("^", "\n")
                for indent in ("", " ", "  ", "   ", "    ", "\t", "\t\t")
            )
            + r")[ \t]+(?P<s>\S+)[ \t]*(?=\r?\n|$)"
        ),
        ("s",),
        anchor=r"password[ \t]+\S",
    ),
)
KEYWORD_ANCHOR = rf"{_ANY_KEYWORD}[\"']?[ \t]*[:=]"
"""Where `keyword_spans` may find a value: a keyword, a quote, spaces, `:` or `=`."""


def _name_before(separator: str) -> re.Pattern[str]:
    """Over the reversed text: `separator`, then (leftwards) spaces, a quote, a keyword."""
    short = (*_SHORT_KEYWORDS, *(_EQUALS_KEYWORDS if separator == "=" else ()))
    words = [word[::-1] for word in _KEYWORDS] + [word[::-1] + _WORD_END for word in short]
    last = "".join(sorted({c for word in words for c in word[0] + word[0].upper()}))
    keyword = _caseless_trie(words)
    return re.compile(
        f"{re.escape(separator)}(?=[ \\t\"'{last}])[ \\t]*[\"']?(?P<keyword>{keyword})"
    )


_NAMES_BEFORE = tuple((sep, _name_before(sep)) for sep in (":", "="))
_NOT_AFTER = {":": (":", "=", "//"), "=": ("=",)}
"""Not a separator when followed by these: `::`, `:=`, `://`, `==`."""
_UNQUOTED = "\\s\"'`,;&<>()\\[\\]{}"
"""Characters that end a value without quotes."""


def _value_pattern(scheme: str = "") -> re.Pattern[str]:
    """A value after `:`, `=` or `=>`: in quotes (to the closing quote, or the end of the line
    when there is none) or bare (not ending in `:`, which would make it a YAML key). A
    `scheme` word before it (`Bearer ` in an Authorization header) stays outside."""
    scheme = f"(?:{scheme}[ \\t]+)?" if scheme else ""
    return re.compile(
        r">?[ \t]*(?:"
        + rf'"{scheme}(?P<dq>(?:[^"\\\r\n]|\\.)+)"?'
        + rf"|'{scheme}(?P<sq>(?:[^'\\\r\n]|\\.)+)'?"
        + rf"|{scheme}(?P<bare>[^{_UNQUOTED}]*[^{_UNQUOTED}:]))"
    )


_VALUE = _value_pattern()
_CREDENTIALS_VALUE = _value_pattern(_SCHEMES)
"""After `Authorization:`, which names its scheme first."""
_NOT_SECRETS = frozenset(
    {"null", "none", "nil", "true", "false", "undefined"}
    | {"str", "string", "bytes", "int", "bool", "boolean", "number", "any", "object"}
)
"""Values that are code, not secrets: `password: str`, `token = None`."""
_NAMED = tuple(word.lower() for word in (*_KEYWORDS, *_SHORT_KEYWORDS, *_EQUALS_KEYWORDS))
_PROSE_START = re.compile(_PROSE)
_REFERENCE = re.compile(rf"{_SCHEMES}|\$[A-Za-z_][A-Za-z0-9_]*")
"""A scheme with no credential after it, or a shell variable: `Authorization: Basic`, `$TOKEN`."""


def keyword_spans(text: str) -> Iterator[_Span]:
    """Values after a keyword-named key and `:`, `=` or `=>`.

    The matches over the reversed text come last-first; they are replayed first-last, and
    one that starts inside the previous value is skipped, so `password=password=...` costs
    one scan, not one per `password=`. Only their offsets are kept.
    """
    size, reversed_text = len(text), ""
    for separator, names in _NAMES_BEFORE:
        if separator not in text:
            continue
        reversed_text = reversed_text or text[::-1]
        found = array("q", (size - m.start() for m in names.finditer(reversed_text)))
        covered = 0
        for at in reversed(found):
            if at < covered or text.startswith(_NOT_AFTER[separator], at):
                continue
            name = names.match(reversed_text, size - at)
            keyword = name["keyword"][::-1].lower() if name else ""
            pattern = _CREDENTIALS_VALUE if keyword == "authorization" else _VALUE
            value = pattern.match(text, at)
            if value and value.lastgroup and not _refused(text, value, keyword):
                covered = value.end(value.lastgroup)
                yield value.span(value.lastgroup)


_XML_CLOSE = re.compile(
    # `</` first, its lookbehind after: a pattern that starts with a literal is searched for
    # by it (a leading lookbehind made `re` try every position: 17 ms a MiB instead of 0.4)
    "</(?<!></)(?:[A-Za-z0-9_.:-]*)"
    + _caseless_trie((*_KEYWORDS, *(word + _WORD_END for word in _SHORT_KEYWORDS)))
    + ">"
)
"""The end of an element named for a secret: `</password>`, `</ns:ApiKey>`."""
XML_ANCHOR = rf"</[A-Za-z0-9_.:-]*{_ANY_KEYWORD}>"


def xml_spans(text: str) -> Iterator[_Span]:
    """The text of elements named for a secret: `<password>x</password>`."""
    for end in _XML_CLOSE.finditer(text):
        start = text.rfind(">", 0, end.start()) + 1
        value = text[start : end.start()]
        if start and value.strip() and "<" not in value:
            yield start, end.start()


_CODE_NAME = re.compile(
    r"(?:[A-Za-z_]+\.)*(?:[A-Za-z_]*_|[a-z][A-Za-z]*(?=[A-Z]))?"
    + f"(?i:{alternation(word for word in _NAMED if word.isidentifier())})"
)
"""Code that names a secret rather than holding one: `token=token`, `self.token`,
`key_password`, `authToken`, `GITHUB_TOKEN`; not a password that ends in a keyword:
`hunter2pass`, `MyPassword`, `adminpassword` (no digits, a `_`, `.` or camelCase hump before
the keyword)."""


def _refused(text: str, value: re.Match[str], keyword: str) -> bool:
    """Whether a value after a keyword is code or prose rather than a secret. Values in
    quotes are data: never refused."""
    bare = value["bare"]
    if bare is None:
        return False
    separator = text[value.start() - 1]
    tight = text[value.start() - 2 : value.start() - 1].isalpha()  # `sig=`, not `sig =`
    return (
        bare.lower() in _NOT_SECRETS
        or _REFERENCE.fullmatch(bare) is not None
        or _CODE_NAME.fullmatch(bare) is not None
        or text.startswith(("(", "[", "{", "<"), value.end())  # code: f(), x[k], Option<T>
        or (keyword == "pwd" and bare.startswith("/"))  # PWD=/home/me is a directory
        or (bare.startswith("#") and text[value.start("bare") - 1] in " \t")  # a comment
        or (keyword == "sig" and not tight)
        or (separator == ":" and _PROSE_START.match(text, value.start("bare")) is not None)
    )
