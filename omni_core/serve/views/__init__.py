"""Pages and pictures for people: ``/v1/deployment`` (and its SVG) and the playground,
whose static files live in ``web/``."""
