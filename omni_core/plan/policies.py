"""Built-in placement policies (filled in by the planning work)."""

BUILTIN_POLICIES: list = []
