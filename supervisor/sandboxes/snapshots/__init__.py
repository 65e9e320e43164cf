"""Snapshots of a sandbox's files: capture (capture.py), the store (store.py), restore
(restore.py)."""
