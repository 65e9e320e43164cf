"""Network modes: the egress link (pyroute2), the proxy that is its only way out, and the
allowlist the proxy enforces."""
