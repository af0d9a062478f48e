"""omni-hello: the plugin written step by step in CONTRIBUTING.md."""
