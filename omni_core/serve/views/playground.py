"""The playground: a page in the browser to hear, chat with and watch the deployment.

Why: people judge a speech model by listening and a deployment by seeing it;
a curl line and a WAV file is not a first impression. ``GET /playground``
serves one static page (``web/index.html``) and its ES modules and CSS
(``web/static/``, mounted at ``/playground/static``), shipped inside the
package: no build step, no framework, no CDN, so it works offline. ``GET /``
is a small page linking to it and to the API.

The page uses only the public API, as its user could: ``/v1/deployment``
(and its SVG), ``/v1/audio/voices``, ``/v1/audio/speech``,
``/v1/chat/completions``, the ``/v1/realtime`` WebSocket (the Talk panel:
microphone in, spoken answers out, with the key as a ``bearer.<key>``
subprotocol), ``/health`` and ``/metrics``. So these pages hold
no secret and are open without the API key (the browser must load the page
before it can ask for the key); everything the page then calls is checked
as usual. ``server.playground = false`` removes the page, its files and
``/`` (404).

The page is served with a Content-Security-Policy that allows only this
origin's scripts, styles and connections: whatever a client manages to put
into a reply (text of a chat answer, a voice's name) is rendered as text,
and could not load or run anything even if it were not.
"""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

PATH = "/playground"
STATIC_PATH = "/playground/static"
WEB = Path(__file__).parent / "web"
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "media-src 'self' blob:; connect-src 'self' blob:; object-src 'none'; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def open_paths(enabled: bool) -> tuple[frozenset[str], tuple[str, ...]]:
    """The paths (exact, and prefixes) the API key does not guard: the pages, when served."""
    if not enabled:
        return frozenset(), ()
    return frozenset({"/", PATH}), (STATIC_PATH + "/",)


def playground_routes(service: Any) -> list[BaseRoute]:
    """``/``, ``/playground`` and its static files."""
    page = (WEB / "index.html").read_text(encoding="utf-8")

    async def playground(request: Request) -> Response:
        return HTMLResponse(page, headers=HEADERS)

    async def index(request: Request) -> Response:
        return HTMLResponse(_index(service), headers=HEADERS)

    return [
        Route("/", index, methods=["GET"]),
        Route(PATH, playground, methods=["GET"]),
        Mount(STATIC_PATH, app=StaticFiles(directory=WEB / "static"), name="playground-static"),
    ]


def _index(service: Any) -> str:
    """A page that says what this server is and where to go: links only, no script."""
    serving = service.serving
    apis = {
        "speech": "<li><code>POST /v1/audio/speech</code>, <code>/v1/audio/voices</code></li>",
        "chat": "<li><code>POST /v1/chat/completions</code></li>",
    }
    listed = "".join(apis[a] for a in serving.api if a in apis)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"/>
<meta name="viewport" content="width=device-width, initial-scale=1"/>
<title>omni: {escape(serving.pipeline)}</title>
<link rel="stylesheet" href="playground/static/style.css"/></head>
<body class="index"><main>
<h1>omni is serving <code>{escape(serving.pipeline)}</code></h1>
<p><a class="button" href="playground">Open the playground</a>: listen, chat, and watch the
deployment's stages and queues live.</p>
<h2>API</h2>
<ul>{listed}
<li><code>GET /v1/models</code>, <code>GET /v1/deployment</code>,
<code>GET /health</code>, <code>GET /metrics</code></li></ul>
</main></body></html>
"""
