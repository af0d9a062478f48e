"""omni's test fixtures (``plugins``, ``short_tmp``) for the walk-through's own tests."""

pytest_plugins = ["omni_core.testing"]
