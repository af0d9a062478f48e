"""The playground's routes (no browser): the page, its files, ``/``, the deployment endpoints,
who may read them without the API key, and ``server.playground = false``.

The page's behaviour in a real browser is tested in ``test_playground_browser.py``.
"""

from __future__ import annotations

import fnmatch
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from live_servers import live_server
from serve_helpers import raw

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

from omni_core.config import load_deployment
from omni_core.schema.deployment import ServerConfig
from omni_core.serve.views.playground import CSP, WEB

ROOT = Path(__file__).parents[2]
SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def no_playground(tmp_path_factory: pytest.TempPathFactory):
    """t-speech with ``server.playground = false`` and an API key."""
    server = live_server(
        "t-speech",
        ["--server.playground", "false"],
        tmp_path_factory.mktemp("noplay"),
        api_key="k",
    ).start()
    try:
        yield server
    finally:
        server.stop()


def _assets(page: str) -> list[str]:
    return re.findall(r'(?:src|href)="(playground/static/[^"]+)"', page)


def test_the_page_and_every_file_it_loads_are_served_with_a_strict_policy(speech_server):
    page = raw("GET", f"{speech_server.url}/playground")
    assert page.status_code == 200
    assert page.headers["Content-Type"].startswith("text/html")
    assert page.headers["Content-Security-Policy"] == CSP
    assert "script-src 'self';" in CSP and "connect-src 'self' blob:;" in CSP
    assets = _assets(page.text)
    assert assets == ["playground/static/style.css", "playground/static/app.js"]
    types = {".js": "javascript", ".css": "text/css"}
    seen = set()
    todo = list(assets)
    while todo:  # app.js imports the other modules: follow every relative import
        path = todo.pop()
        reply = raw("GET", f"{speech_server.url}/{path}")
        assert reply.status_code == 200, path
        assert types[Path(path).suffix] in reply.headers["Content-Type"], path
        seen.add(Path(path).name)
        for module in re.findall(r'from "\./([\w.]+)"', reply.text):
            if module not in seen:
                todo.append(f"playground/static/{module}")
    assert seen == {p.name for p in (WEB / "static").iterdir()}  # nothing shipped unused
    assert "http://" not in page.text and "https://" not in page.text  # no CDN: works offline


def test_the_root_links_to_the_playground(speech_server):
    reply = raw("GET", f"{speech_server.url}/")
    assert reply.status_code == 200
    assert 'href="playground"' in reply.text
    assert "t-speech" in reply.text


def test_deployment_json_describes_the_plan_without_host_paths(speech_server):
    reply = raw("GET", f"{speech_server.url}/v1/deployment")
    assert reply.status_code == 200
    data = reply.json()
    assert data["pipeline"] == "t-speech" and data["api"] == ["speech", "chat"]
    assert data["sample_rate"] == 24000
    assert data["outputs"] == {"text": False, "audio": True}
    assert data["speech_input"] == "read"  # t-speech reads its input aloud
    assert [(p["name"], p["stages"], p["gpu"]) for p in data["processes"]] == [
        ("front", ["prep", "synth"], None),
        ("back", ["audio"], None),
    ]
    assert {(e["source"], e["target"], e["stream"], e["transport"]) for e in data["edges"]} == {
        ("prep", "synth", False, None),
        ("synth", "audio", True, "shm"),
    }
    assert ".sock" not in reply.text and "OMP_NUM_THREADS" not in reply.text


def test_deployment_svg_is_the_plans_picture(speech_server):
    reply = raw("GET", f"{speech_server.url}/v1/deployment.svg")
    assert reply.status_code == 200
    assert reply.headers["Content-Type"].startswith("image/svg+xml")
    root = ET.fromstring(reply.content)
    stages = [g for g in root.iter(f"{SVG}g") if g.get("class") == "stage"]
    assert sorted((g.get("data-process"), g.get("data-stage")) for g in stages) == [
        ("back", "audio"),
        ("front", "prep"),
        ("front", "synth"),
    ]
    # the page shows the picture at a scale that keeps its smallest text at 11 px: none
    # smaller, so a picture that fits is never drawn larger than its own size for it
    sizes = [float(t.get("font-size")) for t in root.iter(f"{SVG}text")]
    assert sizes and min(sizes) >= 11


def _serving(**attributes: object) -> type:
    base = {
        "pipeline_name": "talking",
        "api": ("speech",),
        "audio_stage": "audio",
        "text_stage": None,
        "sample_rate": 24000,
    }
    return type("Talking", (), {**base, **attributes})


def test_speech_input_says_whether_speech_reads_or_answers_and_nothing_else():
    """``speech_input`` (what ``/v1/deployment`` tells the playground's Speech card) is
    "read" unless a pipeline says "answer"; any other value stops the server naming the class."""
    from omni_core.errors import ConfigError
    from omni_core.schema.pipeline import PipelineConfig
    from omni_core.serve.service import Serving

    assert PipelineConfig.speech_input == "read"
    assert Serving.of(_serving()).speech_input == "read"  # a class without the attribute
    assert Serving.of(_serving(speech_input="answer")).speech_input == "answer"
    for wrong in ("reply", "Answer", None):
        with pytest.raises(ConfigError) as caught:
            Serving.of(_serving(speech_input=wrong))
        message = str(caught.value)
        assert f"{__name__}.Talking" in message and "'talking'" in message
        assert f"speech_input {wrong!r}" in message and "known: read, answer" in message


def test_with_a_key_the_pages_stay_open_and_the_api_is_guarded(guarded_server):
    url = guarded_server.url
    for path in ("/", "/playground", "/playground/static/app.js", "/health"):
        assert raw("GET", url + path).status_code == 200, path
    for path in ("/v1/deployment", "/v1/deployment.svg", "/v1/audio/voices"):
        reply = raw("GET", url + path)
        assert reply.status_code == 401, path
        assert reply.json()["error"]["code"] == "invalid_api_key"
        wrong = raw("GET", url + path, headers={"Authorization": "Bearer nope"})
        assert wrong.json()["error"]["message"] == "invalid API key"
        good = raw("GET", url + path, headers={"Authorization": "Bearer sekret"})
        assert good.status_code == 200, path
    # the open prefix is the static folder's, not anything that starts like it
    assert raw("GET", url + "/playground/staticx").status_code == 401
    assert raw("GET", url + "/playground/static/missing.js").status_code == 404


def test_playground_false_removes_the_page_the_files_and_the_root(no_playground):
    url = no_playground.url
    key = {"Authorization": "Bearer k"}
    for path in ("/", "/playground", "/playground/static/app.js"):
        assert raw("GET", url + path).status_code == 401, path  # no longer open ...
        reply = raw("GET", url + path, headers=key)
        assert reply.status_code == 404, path  # ... and not there
        assert reply.json()["error"]["message"] == f"no such endpoint: {path}"
    assert raw("GET", url + "/v1/deployment", headers=key).status_code == 200


def test_the_setting_defaults_on_and_is_documented(plugins):
    assert ServerConfig().playground is True
    flags = ["--server.playground", "false"]
    server = load_deployment(None, flags, pipeline="qwen3-tts", plugins=plugins).config.server
    assert server.playground is False
    assert ServerConfig.model_fields["playground"].description
    readme = (ROOT / "README.md").read_text()
    assert "server.playground" in readme and "/playground" in readme
    assert "--format svg" in readme


def test_the_page_files_are_package_data():
    """A wheel ships what ``pyproject.toml`` names; every file of ``web/`` must match a pattern."""
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]["omni_core"]
    package = ROOT / "omni_core"
    files = [p.relative_to(package).as_posix() for p in WEB.rglob("*") if p.is_file()]
    assert "serve/views/web/index.html" in files
    for name in files:
        assert any(fnmatch.fnmatch(name, pattern) for pattern in patterns), name


def test_the_talk_panel_is_on_the_page_hidden_until_chat_is_known(speech_server):
    """The Talk panel's parts are in the page (hidden: app.js shows it for a chat pipeline), and
    its module opens /v1/realtime with the key as a subprotocol, never in the URL."""
    page = raw("GET", f"{speech_server.url}/playground").text
    assert re.search(r'<section id="talk-panel" class="panel"[^>]* hidden>', page)
    for part in ("talk-toggle", "talk-status", "talk-latency", "talk-log", "talk-error"):
        assert f'id="{part}"' in page, part
    app = raw("GET", f"{speech_server.url}/playground/static/app.js").text
    assert 'import { TalkPanel } from "./talk.js";' in app
    talk = raw("GET", f"{speech_server.url}/playground/static/talk.js")
    assert talk.status_code == 200 and "javascript" in talk.headers["Content-Type"]
    assert 'new URL("v1/realtime", document.baseURI)' in talk.text
    assert "protocols.push(`bearer.${this.api.key}`)" in talk.text
    assert "?key" not in talk.text and "api_key=" not in talk.text
