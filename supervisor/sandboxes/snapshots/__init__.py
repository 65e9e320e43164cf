"""Snapshots of a sandbox's files: capture (capture.py), the store (repository.py), restore
(restore.py)."""
