"""The runtime: launch a plan, run stages, move payloads between them."""
