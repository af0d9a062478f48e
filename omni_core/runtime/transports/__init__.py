"""Built-in transports (filled in by the runtime work)."""

BUILTIN_TRANSPORTS: list = []
