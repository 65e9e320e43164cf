"""The E2B-compatible front: the E2B control plane (sandboxes: create, connect, list, info,
timeout, kill, metrics, pause) and envd (filesystem, files, health) over plain HTTP, for the
unmodified E2B SDKs. Every tool call goes through the supervisor's one pipeline and every
sandbox through the sandbox manager's one lease: no second path for policy or audit."""
