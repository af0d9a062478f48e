"""The HTTP plumbing every API family shares: app assembly, auth, OpenAI-shaped errors,
request bodies and their limits, the request schemas, metrics, and log rate limits."""
