"""Sandboxes: the manager (registry, per-key locks, quotas, leases), the containers behind
them, their host folders, the agent link, health and healing, housekeeping."""
