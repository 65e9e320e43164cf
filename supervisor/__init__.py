"""The Stockade supervisor: the gRPC server, policy and the sandbox manager."""
