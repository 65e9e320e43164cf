"""What the supervisor tells about itself: the audit log and its retention, metrics,
telemetry and traces."""
