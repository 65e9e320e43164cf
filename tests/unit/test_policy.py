"""The tool policy pipeline, table-style: each step, deny over allow, also_allow, subagent
and leaf deny, aliases, groups, and config errors."""

from __future__ import annotations

import tomllib
from typing import Any

import pytest

from stockade.supervisor.config import Config, _build
from stockade.supervisor.errors import ConfigError
from stockade.supervisor.models import CallContext
from stockade.supervisor.policy.tool_policy import PolicyEngine
from stockade.supervisor.tools.catalog import Catalog

ALL = {
    "exec",
    "process",
    "read_file",
    "write_file",
    "edit_file",
    "apply_patch",
    "list_files",
    "glob",
    "search",
}
RUNTIME = {"exec", "process"}
FS = ALL - RUNTIME
NO_EXEC = ALL - {"exec"}


def engine(toml: str) -> PolicyEngine:
    config: Config = _build(Config, tomllib.loads(toml), "")
    return PolicyEngine(config, Catalog(config.custom_tools))


def allowed(toml: str, **ctx: Any) -> set[str]:
    return {t.name for t in engine(toml).allowed_tools(CallContext(**ctx))}


CASES = [
    ("default is full", "", {}, ALL),
    ("1 global profile", '[tools]\nprofile = "coding"', {}, ALL),
    ("1 minimal has none of ours", '[tools]\nprofile = "minimal"', {}, set()),
    (
        "2 provider profile",
        '[tools.by_provider.openai]\nprofile = "minimal"',
        {"provider": "openai"},
        set(),
    ),
    ("2 other provider unaffected", '[tools.by_provider.openai]\nprofile = "minimal"', {}, ALL),
    ("3 global allow", '[tools]\nallow = ["group:fs"]', {}, FS),
    (
        "3 alias in allow",
        '[tools]\nallow = ["read", "grep", "ls"]',
        {},
        {"read_file", "search", "list_files"},
    ),
    (
        "4 provider allow",
        '[tools.by_provider.gemini]\nallow = ["exec"]',
        {"provider": "gemini"},
        {"exec"},
    ),
    (
        "5 agent allow",
        '[agents.bot.tools]\nallow = ["read_file"]',
        {"agent_id": "bot"},
        {"read_file"},
    ),
    (
        "5 other agent unaffected",
        '[agents.bot.tools]\nallow = ["read_file"]',
        {"agent_id": "x"},
        ALL,
    ),
    (
        "6 agent+provider allow",
        '[agents.bot.tools.by_provider.openai]\nallow = ["glob", "search"]',
        {"agent_id": "bot", "provider": "openai"},
        {"glob", "search"},
    ),
    (
        "7 group allow",
        '[groups.g1.tools]\nallow = ["read_file", "exec"]',
        {"peer_kind": "group", "chat_id": "g1"},
        {"read_file", "exec"},
    ),
    (
        "7 wildcard group",
        '[groups."*".tools]\ndeny = ["exec"]',
        {"peer_kind": "group", "chat_id": "any"},
        NO_EXEC,
    ),
    (
        "7 group policy not for direct chats",
        '[groups."*".tools]\ndeny = ["exec"]',
        {"peer_kind": "direct", "chat_id": "any"},
        ALL,
    ),
    (
        "allow steps intersect",
        '[tools]\nallow = ["group:fs"]\n[agents.a.tools]\nallow = ["exec", "glob"]',
        {"agent_id": "a"},
        {"glob"},
    ),
    ("global deny", '[tools]\ndeny = ["exec"]', {}, NO_EXEC),
    ("deny beats allow", '[tools]\nallow = ["exec"]\ndeny = ["exec_shell"]', {}, set()),
    ("deny group", '[tools]\ndeny = ["group:fs"]', {}, RUNTIME),
    ("deny runtime group", '[tools]\ndeny = ["group:runtime"]', {}, FS),
    (
        "agent deny",
        '[agents.a.tools]\ndeny = ["write", "edit"]',
        {"agent_id": "a"},
        ALL - {"write_file", "edit_file"},
    ),
    (
        "also_allow adds back",
        '[tools]\nallow = ["group:fs"]\nalso_allow = ["exec"]',
        {},
        ALL - {"process"},
    ),
    ("also_allow never over deny", '[tools]\ndeny = ["exec"]\nalso_allow = ["exec"]', {}, NO_EXEC),
    (
        "agent also_allow",
        '[tools]\nprofile = "minimal"\n[agents.a.tools]\nalso_allow = ["read_file"]',
        {"agent_id": "a"},
        {"read_file"},
    ),
    ("subagent deny", '[subagents]\ndeny = ["exec"]', {"subagent_depth": 1}, NO_EXEC),
    ("subagent deny not at depth 0", '[subagents]\ndeny = ["exec"]', {"subagent_depth": 0}, ALL),
    (
        "leaf deny at max depth",
        '[subagents]\nmax_depth = 2\nleaf_deny = ["write_file"]',
        {"subagent_depth": 2},
        ALL - {"write_file"},
    ),
    (
        "leaf deny not below max",
        '[subagents]\nmax_depth = 2\nleaf_deny = ["write_file"]',
        {"subagent_depth": 1},
        ALL,
    ),
]


@pytest.mark.parametrize(
    ("toml", "ctx", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_pipeline(toml: str, ctx: dict[str, Any], expected: set[str]) -> None:
    assert allowed(toml, **ctx) == expected


@pytest.mark.parametrize(
    ("toml", "ctx", "tool", "step"),
    [
        ('[tools]\nprofile = "minimal"', {}, "exec", "tools.profile"),
        (
            "[tools.by_provider.o]\nprofile = 'minimal'",
            {"provider": "o"},
            "exec",
            "tools.by_provider.o.profile",
        ),
        ('[tools]\nallow = ["read_file"]', {}, "exec", "tools.allow"),
        (
            '[agents.a.tools]\nallow = ["read_file"]',
            {"agent_id": "a"},
            "exec",
            "agents.a.tools.allow",
        ),
        ('[tools]\ndeny = ["exec"]\nallow = ["read"]', {}, "exec", "tools.deny"),
        (
            '[agents.a.tools.by_provider.o]\ndeny = ["exec"]',
            {"agent_id": "a", "provider": "o"},
            "exec",
            "agents.a.tools.by_provider.o.deny",
        ),
        ('[subagents]\ndeny = ["exec"]', {"subagent_depth": 3}, "exec", "subagents.deny"),
        ('[subagents]\nleaf_deny = ["exec"]', {"subagent_depth": 1}, "exec", "subagents.leaf_deny"),
        ("", {}, "exec", "allowed"),
    ],
)
def test_decision_names_the_step(toml: str, ctx: dict[str, Any], tool: str, step: str) -> None:
    decision = engine(toml).decide(tool, CallContext(**ctx))
    assert decision.step == step
    assert decision.allowed is (step == "allowed")


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('[tools]\nallow = ["rm_everything"]', "tools.allow: 'rm_everything' is neither a tool"),
        ('[tools]\ndeny = ["group:nope"]', "tools.deny: unknown group 'group:nope'"),
        ('[tools]\nprofile = "godmode"', "tools.profile: unknown profile 'godmode'"),
        ('[agents.a.tools]\nalso_allow = ["web_search"]', "agents.a.tools.also_allow"),
        ('[subagents]\nleaf_deny = ["x"]', "subagents.leaf_deny"),
        ('[groups.g.tools]\nallow = ["exec", "nope"]', "groups.g.tools.allow"),
    ],
)
def test_unknown_names_are_config_errors(toml: str, message: str) -> None:
    assert message in config_error(toml)


def config_error(toml: str) -> str:
    """The ConfigError's message for a policy built from `toml`."""
    with pytest.raises(ConfigError) as info:
        engine(toml)
    return str(info.value)


def test_reference_groups_without_tools_are_empty_not_errors() -> None:
    assert allowed('[tools]\ndeny = ["group:web", "group:memory"]') == ALL


def test_custom_tools_join_the_pipeline() -> None:
    toml = """
[[custom_tools]]
name = "dns_lookup"
description = "Look up DNS records"
command = "dig +short {{.domain}}"
[custom_tools.parameters]
type = "object"
required = ["domain"]
properties = { domain = { type = "string" } }
[agents.a.tools]
deny = ["group:custom"]
"""
    assert allowed(toml) == ALL | {"dns_lookup"}
    assert allowed(toml, agent_id="a") == ALL
    assert "dns_lookup" not in allowed(toml + '[tools]\nprofile = "messaging"\n')


def _deep_schema(levels: int) -> str:
    inner = '{ type = "string" }'
    for _ in range(levels):
        inner = f'{{ type = "object", properties = {{ a = {inner} }} }}'
    return inner


CUSTOM_HEAD = '[[custom_tools]]\nname = "t"\ndescription = "d"\ncommand = "true"\n'


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("[limits]\nrate_per_s = nan", "limits.rate_per_s must be a finite number"),
        ("[limits]\nrate_per_s = inf", "limits.rate_per_s must be a finite number"),
        ("[approvals]\ntimeout_s = nan", "approvals.timeout_s must be a finite number"),
        ("[approvals]\ntimeout_s = inf", "approvals.timeout_s must be a finite number"),
        ("[subagents]\nmax_depth = 0", "subagents.max_depth must be at least 1"),
        ("[subagents]\nmax_depth = -3", "subagents.max_depth must be at least 1"),
        ("[audit]\nmax_arguments_bytes = -1", "audit.max_arguments_bytes must be positive"),
        ("[tools]\nuser_max_bytes = 0", "tools.user_max_bytes must be positive"),
        (CUSTOM_HEAD + "timeout_s = nan", "custom_tools.t.timeout_s must be a finite number"),
        (CUSTOM_HEAD + "timeout_s = inf", "custom_tools.t.timeout_s must be a finite number"),
        (
            CUSTOM_HEAD + f"parameters = {_deep_schema(60)}",
            "custom_tools.t.parameters nests deeper than",
        ),
        (
            CUSTOM_HEAD
            + 'parameters = { type = "object", properties = { a = { "$ref" = "#/x" } } }',
            "custom_tools.t.parameters: $ref '#/x' points nowhere in the schema",
        ),
        (
            CUSTOM_HEAD
            + 'parameters = { type = "object", properties = { a = { "$ref" = "http://h/x" } } }',
            "custom_tools.t.parameters: $ref 'http://h/x' points nowhere in the schema",
        ),
        (
            CUSTOM_HEAD + 'parameters = { type = "object", "$defs" = { a = { "$id" = "u:a" } } }',
            "custom_tools.t.parameters: $id is allowed at the top only",
        ),
        (
            CUSTOM_HEAD.replace('"d"', '"' + "d" * 1025 + '"'),
            "custom_tools.t.description is 1025 characters long; OpenAI takes at most 1024",
        ),
        ('[agents.""]\napprovals = "off"', "agents: an id must not be empty"),
        ('[groups.""]\ntools = { deny = ["exec"] }', "groups: an id must not be empty"),
        ('[tools.by_provider.""]\ndeny = ["exec"]', "tools.by_provider: an id must not be empty"),
        ('[tools]\nallow = ["group:"]', "unknown group 'group:'"),
        ('[tools]\nallow = ["group:FS"]', "unknown group 'group:FS'"),
        ('[tools]\nallow = "exec"', "tools.allow must be a list"),
        ("[tools]\nallow = [1]", "tools.allow[0] must be str"),
        ("[tools]\nprofile = 1", "tools.profile must be str"),
        ("[agents.a]\ntools = []", "[agents.a.tools] must be a table"),
    ],
)
def test_hostile_policy_config_is_a_clear_error(toml: str, message: str) -> None:
    assert message in config_error(toml)


def test_a_rate_too_high_to_matter_loads() -> None:
    """1e9 calls a second is how benchmarks and tests say "no rate limit"."""
    config: Config = _build(Config, tomllib.loads("[limits]\nrate_per_s = 1e9"), "")
    assert config.limits.rate_per_s == 1e9


def test_huge_lists_load() -> None:
    names = ", ".join(['"exec"', '"read"', '"group:fs"'] * 20_000)
    assert allowed(f"[tools]\nallow = [{names}]\ndeny = [{names}]") == set()


FULL_ONLY_TOOL = """
[[custom_tools]]
name = "deploy"
description = "Deploy"
command = "true"
profiles = ["full"]
"""

PROFILE_CASES = [
    (
        "2 provider profile overrides the global one (GoClaw step 2), widening too",
        '[tools]\nprofile = "minimal"\n[tools.by_provider.openai]\nprofile = "coding"',
        {"provider": "openai"},
        ALL,
    ),
    (
        "2 without that provider the global profile holds",
        '[tools]\nprofile = "minimal"\n[tools.by_provider.openai]\nprofile = "coding"',
        {"provider": "gemini"},
        set(),
    ),
    (
        "2 provider profile full brings a full-only tool back",
        FULL_ONLY_TOOL + '[tools]\nprofile = "coding"\n[tools.by_provider.o]\nprofile = "full"',
        {"provider": "o"},
        ALL | {"deploy"},
    ),
    (
        "agent's provider profile overrides the agent's profile",
        '[agents.a.tools]\nprofile = "minimal"\n[agents.a.tools.by_provider.o]\nprofile = "full"',
        {"agent_id": "a", "provider": "o"},
        ALL,
    ),
    (
        "agent's profile still narrows for other providers",
        '[agents.a.tools]\nprofile = "minimal"\n[agents.a.tools.by_provider.o]\nprofile = "full"',
        {"agent_id": "a", "provider": "x"},
        set(),
    ),
    (
        "an agent's profile never widens the global one",
        '[tools]\nprofile = "minimal"\n[agents.a.tools]\nprofile = "full"',
        {"agent_id": "a"},
        set(),
    ),
    (
        "provider allow still intersects (step 4)",
        '[tools]\nallow = ["group:fs"]\n[tools.by_provider.o]\nallow = ["exec", "read"]',
        {"provider": "o"},
        {"read_file"},
    ),
    ("group:goclaw is every built-in tool", '[tools]\nallow = ["group:goclaw"]', {}, ALL),
    (
        "group:openclaw leaves custom tools out",
        FULL_ONLY_TOOL + '[tools]\nallow = ["group:openclaw"]',
        {},
        ALL,
    ),
    (
        "OpenClaw's groups without tools here are empty",
        '[tools]\ndeny = ["group:nodes", "group:agents", "group:media"]',
        {},
        ALL,
    ),
]


@pytest.mark.parametrize(
    ("toml", "ctx", "expected"),
    [c[1:] for c in PROFILE_CASES],
    ids=[c[0] for c in PROFILE_CASES],
)
def test_profiles_and_reference_groups(toml: str, ctx: dict[str, Any], expected: set[str]) -> None:
    assert allowed(toml, **ctx) == expected


def test_overriding_profile_is_the_step_named() -> None:
    toml = '[tools]\nprofile = "coding"\n[tools.by_provider.o]\nprofile = "minimal"'
    decision = engine(toml).decide("exec", CallContext(provider="o"))
    assert (decision.allowed, decision.step) == (False, "tools.by_provider.o.profile")


def test_local_references_and_property_names_like_keywords_load() -> None:
    toml = (
        CUSTOM_HEAD
        + 'parameters = { type = "object", "$defs" = { s = { type = "string" } }, '
        + 'properties = { a = { "$ref" = "#/$defs/s" }, "$ref" = { type = "string" } } }'
    )
    assert "t" in allowed(toml)


@pytest.mark.parametrize("profiles", ['["coding"]', '["minimal"]', "[]"])
def test_full_profile_restricts_nothing(profiles: str) -> None:
    """GoClaw and OpenClaw: `full` is every tool, whatever profiles a custom tool lists."""
    toml = CUSTOM_HEAD + f"profiles = {profiles}\n"
    assert allowed(toml) == ALL | {"t"}
    assert allowed(toml + '[tools]\nprofile = "full"\n') == ALL | {"t"}


def test_decisions_cache_only_configured_names() -> None:
    """Agent ids, providers and chat ids come from callers: unknown ones share the rules of
    none, and the decision cache must not keep each made-up (possibly huge) name alive."""
    policy = engine('[agents.a.tools]\ndeny = ["exec"]\n[groups.g.tools]\ndeny = ["glob"]')
    before = policy._rules._decide.cache_info().currsize
    for i in range(2000):
        made_up = f"{i}-" + "x" * 100_000
        ctx = CallContext(agent_id=made_up, provider=made_up, chat_id=made_up, peer_kind="group")
        assert policy.decide("exec", ctx).allowed
        assert policy.decide("exec", CallContext(subagent_depth=10**9 + i)).allowed
    assert policy._rules._decide.cache_info().currsize - before <= 4
    assert not policy.decide("exec", CallContext(agent_id="a")).allowed
    assert not policy.decide("glob", CallContext(chat_id="g", peer_kind="group")).allowed
