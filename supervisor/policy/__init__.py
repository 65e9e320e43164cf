"""Host-side policy: what may run, and what may leave the host."""
