"""The agent never imports from the workspace. `python3 -m` puts the working folder first on
sys.path, and the agent's is /workspace, the sandbox user's: a workspace `argparse.py` (or an
`asyncio/`, `grpc/` or `stockade/` package) would run as the agent, with its capabilities,
when the next container starts on that workspace. The agent runs as `python3 -P`; here each
shadow exits at once if it is ever imported, so an agent that imported one would never answer.
On Podman and Docker."""

from __future__ import annotations

import pytest

from stockade.client import Stockade

pytestmark = pytest.mark.timeout(300)

SHADOWS = (
    "argparse.py", "json.py", "asyncio/__init__.py", "grpc/__init__.py",
    "stockade/__init__.py", "google/__init__.py",
)  # fmt: skip
"""Modules and packages the agent imports at its start, shadowed in the workspace."""
EXIT = "import os\nos._exit(3)\n"


def test_a_workspace_module_never_runs_in_the_agent(client: Stockade, key: str) -> None:
    box = client.sandbox(key)
    for path in SHADOWS:
        box.write_file(path, EXIT)
    assert client.destroy_sandbox(key, delete_workspace=False)
    result = box.exec("pgrep -a -U 65533 python3 | grep -v '^1 '; cat argparse.py")
    assert result.exit_code == 0, result.for_llm
    assert " -P -m stockade.agent" in result.stdout
    assert result.stdout.endswith(EXIT)
