"""Which tools a caller may use: GoClaw's 7-step allow pipeline, then deny lists, then
additive also_allow, then subagent deny lists. Deny always wins.

    1 tools.profile                    5 agents.<id>.tools (profile, allow)
    2 tools.by_provider.<p>.profile    6 agents.<id>.tools.by_provider.<p> (profile, allow)
    3 tools.allow                      7 groups.<chat_id|*>.tools (profile, allow)
    4 tools.by_provider.<p>.allow

A provider's profile overrides the profile of its level (GoClaw's step 2: the provider's
replaces tools.profile; an agent's provider profile replaces the agent's); the levels' profiles
and every allow list then intersect, so an agent or group can narrow, never widen.

Every name is checked when the config is loaded (unknown names are a ConfigError); the
decision is pure over the frozen result and says which step decided."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass

from stockade.supervisor.config import Config, ToolPolicy, ToolsConfig
from stockade.supervisor.models import CallContext
from stockade.supervisor.tools.catalog import Catalog, ToolSpec

ALLOWED = "allowed"


@dataclass(frozen=True)
class Decision:
    allowed: bool
    step: str
    """ALLOWED, or the config path of the step that removed the tool."""

    @property
    def reason(self) -> str:
        return "allowed" if self.allowed else f"removed by {self.step}"


@dataclass(frozen=True)
class _Rules:
    """One scope's rules, expanded to tool names (None: this step does not restrict)."""

    where: str
    profile: frozenset[str] | None
    allow: frozenset[str] | None
    deny: frozenset[str]
    also_allow: frozenset[str]
    level: str = ""
    """For a provider's rules: the scope whose profile this one's overrides."""


class PolicyEngine:
    """The tool policy of the running configuration: one immutable ToolRules, swapped whole
    by reload() (`stockade reload`), so a decision is made over one configuration."""

    def __init__(self, config: Config, catalog: Catalog) -> None:
        self._catalog = catalog
        self._rules = ToolRules(config, catalog)

    def rules_for(self, config: Config) -> ToolRules:
        """The rules of another configuration (of the same catalog): ConfigError for a name
        it does not know. Nothing changes until reload() is given them."""
        return ToolRules(config, self._catalog)

    def reload(self, rules: ToolRules) -> None:
        self._rules = rules

    def decide(self, tool: str, ctx: CallContext) -> Decision:
        """Whether `tool` (canonical name) may be called in this context; which step said so."""
        return self._rules.decide(tool, ctx)

    def allowed_tools(self, ctx: CallContext) -> list[ToolSpec]:
        return self._rules.allowed_tools(ctx)


class ToolRules:
    """One configuration's tool policy, expanded once; never changed after it is made."""

    def __init__(self, config: Config, catalog: Catalog) -> None:
        self._catalog = catalog
        self._decide = functools.lru_cache(maxsize=4096)(self._decided)
        tools = config.tools
        self._global = self._rules(tools, "tools", default_profile=tools.profile or "full")
        self._providers = {
            p: self._rules(t, f"tools.by_provider.{p}", level="tools")
            for p, t in tools.by_provider.items()
        }
        agents = config.agents
        self._agents = {a: self._rules(c.tools, f"agents.{a}.tools") for a, c in agents.items()}
        self._agent_providers = {
            (a, p): self._rules(t, f"agents.{a}.tools.by_provider.{p}", level=f"agents.{a}.tools")
            for a, c in config.agents.items()
            for p, t in c.tools.by_provider.items()
        }
        self._known_providers = self._providers.keys() | {p for _, p in self._agent_providers}
        self._groups = {
            g: self._rules(c.tools, f"groups.{g}.tools") for g, c in config.groups.items()
        }
        sub = config.subagents
        self._sub_deny = catalog.expand_all(sub.deny, "subagents.deny")
        self._leaf_deny = catalog.expand_all(sub.leaf_deny, "subagents.leaf_deny")
        self._max_depth = sub.max_depth

    def _rules(
        self,
        policy: ToolPolicy | ToolsConfig,
        where: str,
        default_profile: str = "",
        level: str = "",
    ) -> _Rules:
        profile = policy.profile or default_profile
        return _Rules(
            where,
            self._catalog.profile(profile, f"{where}.profile") if profile else None,
            self._catalog.expand_all(policy.allow, f"{where}.allow") if policy.allow else None,
            self._catalog.expand_all(policy.deny, f"{where}.deny"),
            self._catalog.expand_all(policy.also_allow, f"{where}.also_allow"),
            level,
        )

    def decide(self, tool: str, ctx: CallContext) -> Decision:
        """Whether `tool` (canonical name) may be called in this context; which step said so."""
        return self._decide(tool, self._scope(ctx))

    def allowed_tools(self, ctx: CallContext) -> list[ToolSpec]:
        scope = self._scope(ctx)
        return [t for t in self._catalog.tools.values() if self._decide(t.name, scope).allowed]

    def _decided(self, tool: str, scope: tuple[str, str, str, int]) -> Decision:
        """A decision (cached per rules by _decide: a reload's rules start empty)."""
        chain = list(self._chain(scope))
        removed = next((s for s, allow in _allow_steps(chain) if tool not in allow), None)
        denied = next((r.where + ".deny" for r in chain if tool in r.deny), None)
        if denied:
            return Decision(False, denied)
        if removed and not any(tool in r.also_allow for r in chain):
            return Decision(False, removed)
        depth = scope[3]
        if depth >= 1 and tool in self._sub_deny:
            return Decision(False, "subagents.deny")
        if depth >= self._max_depth and depth >= 1 and tool in self._leaf_deny:
            return Decision(False, "subagents.leaf_deny")
        return Decision(True, ALLOWED)

    def _chain(self, scope: tuple[str, str, str, int]) -> Iterator[_Rules]:
        """The scopes that apply, in pipeline order."""
        agent, provider, group, _ = scope
        yield self._global
        found = [
            self._providers.get(provider),
            self._agents.get(agent),
            self._agent_providers.get((agent, provider)),
            self._groups.get(group) or (self._groups.get("*") if group else None),
        ]
        yield from (r for r in found if r is not None)

    def _scope(self, ctx: CallContext) -> tuple[str, str, str, int]:
        """The context as far as the config tells its parts apart: names it does not know
        (callers make them up) count as none, so the decision cache holds configured names
        only; the depth as none, subagent or leaf."""
        agent = ctx.agent_id if ctx.agent_id in self._agents else ""
        provider = ctx.provider if ctx.provider in self._known_providers else ""
        group = ""
        if ctx.peer_kind == "group" and ctx.chat_id:
            group = ctx.chat_id if ctx.chat_id in self._groups else "*"
        depth = min(max(ctx.subagent_depth, 0), self._max_depth)
        return agent, provider, group, depth


def _allow_steps(chain: list[_Rules]) -> Iterator[tuple[str, frozenset[str]]]:
    """(step, tools it keeps) in pipeline order: profiles first (a provider's in place of its
    level's), then allow lists."""
    profiles: dict[str, tuple[str, frozenset[str]]] = {}
    for rules in chain:
        if rules.profile is not None:
            profiles[rules.level or rules.where] = (f"{rules.where}.profile", rules.profile)
    yield from profiles.values()
    for rules in chain:
        if rules.allow is not None:
            yield f"{rules.where}.allow", rules.allow
