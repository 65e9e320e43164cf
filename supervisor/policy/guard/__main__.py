"""`python -m stockade.supervisor.policy.guard > docs/policy-guard-rules.md`: the rule table."""

from stockade.supervisor.policy.guard.rules import rules_markdown

print(rules_markdown(), end="")
