"""Fronts other than the gRPC API (api/): each turns its protocol's requests into the same
domain calls and runs them through the one pipeline (calls/pipeline.py)."""
