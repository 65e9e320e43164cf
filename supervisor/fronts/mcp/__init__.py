"""The MCP front door: tools over the Model Context Protocol's streamable HTTP transport
(the official `mcp` SDK), with the gRPC API's tokens, tenants and pipeline. See docs/mcp.md."""
