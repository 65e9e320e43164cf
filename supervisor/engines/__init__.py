"""Container engines: the backends (Podman, Docker), their services, the sandbox image,
isolation checks and the supervisor running inside a container."""
