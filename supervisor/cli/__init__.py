"""The `stockade` command: serve, image build, doctor, and the client commands."""

from stockade.supervisor.cli.main import main

__all__ = ["main"]
