"""Internal plugins: the core's own behaviour, registered through the public hooks."""
