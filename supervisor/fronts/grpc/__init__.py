"""The gRPC edge: servicers, conversion between protobuf and domain objects, the status
mapping, the authenticating interceptor."""
