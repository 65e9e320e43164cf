"""The security suite runs against the same real engines and supervisor as the integration
tests: their fixtures, shared."""

from tests.integration.conftest import client, engine, key, supervisor

__all__ = ["client", "engine", "key", "supervisor"]
