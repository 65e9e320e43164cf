"""The state supervisors may share (base.py): SQLite in the state directory for one
supervisor on one host (sqlite.py, the default), or PostgreSQL for replicas of one
installation (postgres.py, `[state] url`)."""

from __future__ import annotations

from stockade.supervisor.state.base import SharedState, redacted_url
from stockade.supervisor.state.sqlite import SqliteState

__all__ = ["SharedState", "SqliteState", "open_state", "redacted_url"]


def open_state(config: object, instance: str) -> SharedState:
    """The configured state: PostgreSQL when state.url is set, else SQLite in state_dir.
    `instance`: this supervisor's instance id (what its rows in shared tables carry)."""
    from stockade.supervisor.config import Config

    assert isinstance(config, Config)
    if config.state.url:
        from stockade.supervisor.state.postgres import PostgresState

        return PostgresState.open(config.state.url, instance)
    return SqliteState.from_config(config)
