"""The front doors: gRPC (grpc/), MCP (mcp/), the E2B API (e2b/) and the operator's console
(console/). Each turns its protocol's requests into the same domain calls and runs them
through the one pipeline (calls/pipeline.py); none imports another front (http.py is the
HTTP fronts' shared listener)."""
