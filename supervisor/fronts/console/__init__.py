"""The operator's console: server-rendered pages over the same domain objects the gRPC
servicers use (sandbox manager, approval manager, audit log, metrics registry)."""
