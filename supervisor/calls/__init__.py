"""One tool call's path: the pipeline (policy, validation, guard, the agent call through
the sandbox's lease, scrubbing, caps, audit), streaming, Interact, the catalog and schemas."""
