"""Configuration loading (supervisor/config/loading.py, with every section's checks) from
TOML text. Clean refusal: ConfigError (a file that does not parse or whose values are
wrong)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from stockade.supervisor.config import load_config
from stockade.supervisor.errors import ConfigError

INSTRUMENT = ("stockade", "tomllib")
REFUSALS: tuple[type[BaseException], ...] = (ConfigError,)
FILE = Path(tempfile.mkdtemp(prefix="stockade-fuzz-config-")) / "stockade.toml"


def one(data: bytes) -> None:
    FILE.write_bytes(data)
    load_config(FILE)
