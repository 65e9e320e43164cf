"""Stockade: a sandbox-first execution appliance for AI-agent tools."""

__version__ = "0.1.0"
