"""The playground in a real headless Chromium, driven by Playwright.

What a person would check by hand, asserted from the page itself: it loads
without console errors; Speak plays audio before the request has finished
(the page's own timing readout and its AudioContext's clock say so); another
voice changes the request; the deployment view names every stage with its
process and shows queue depth moving while a burst of requests runs; a wrong
API key gets a clear message; Qwen3-Omni answers an image and a question as
a stream; at a phone's 390 px the seven-process deployment keeps its text at
11 px or more and its table's words whole; the Speech card says whether the
model reads the text or answers it; every chat answer with audio carries a
player and an "answer.wav" download. Screenshots of the playground and of
the plan picture are written under each test's ``tmp_path`` for a person to
look at.

The browser is Debian's ``chromium`` (``make browser`` installs it;
``$OMNI_CHROMIUM`` names another), never one Playwright downloads. Without
it, or without the ``playwright`` package, these tests skip and say why.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import subprocess
import threading
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from serve_helpers import raw

from omni_core.cli import main
from omni_core.plugins import OmniPlugins
from omni_core.testing import plan_on_cpu, short_private_dir

EXAMPLES = Path(__file__).parents[2] / "examples"
CHROMIUM_ARGS = [
    "--autoplay-policy=no-user-gesture-required",
    "--use-fake-ui-for-media-stream",
    "--use-fake-device-for-media-stream",
]
READY = "body[data-ready=true]"


def find_chromium() -> str | None:
    """``$OMNI_CHROMIUM``, else the system's chromium (Debian's package)."""
    for candidate in (
        os.environ.get("OMNI_CHROMIUM"),
        shutil.which("chromium"),
        shutil.which("chromium-browser"),
        "/usr/bin/chromium",
    ):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


CHROMIUM = find_chromium()
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no chromium to drive: run `make browser` (Debian's chromium package) "
    "or set OMNI_CHROMIUM to a Chromium binary",
)


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright is not installed: pip install -e '.[test]'"
    )
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def browser(chromium: Any) -> Iterator[Any]:
    """A fresh browser context per test (its own session storage), closed with its pages
    even when the test fails, so no page keeps polling a server after its test."""
    context = chromium.new_context()
    try:
        yield context
    finally:
        context.close()


@contextmanager
def _serve(deploy: Path, flags: list[str] | None = None) -> Iterator[Any]:
    pytest.importorskip("torch")
    with short_private_dir() as base:
        planned = plan_on_cpu(OmniPlugins(env={}), base, deploy=deploy, flags=flags or [])
        with planned.serve() as live:
            live.plan = planned.plan
            yield live


@pytest.fixture(scope="module")
def tts_demo() -> Iterator[Any]:
    """The built-in default: tiny Qwen3-TTS, random weights, one CPU process."""
    with _serve(EXAMPLES / "qwen3_tts_demo.toml") as live:
        yield live


@pytest.fixture(scope="module")
def qwen3_omni_demo() -> Iterator[Any]:
    """The seven-process Qwen3-Omni demo (tiny, random weights, CPU), for the slow tests."""
    with _serve(EXAMPLES / "qwen3_omni_demo.toml") as live:
        yield live


class Tab:
    """A page, with every console error, page error and failed request it met."""

    def __init__(self, browser: Any, url: str, width: int = 1280, height: int = 900):
        self.page = browser.new_page()
        self.page.set_viewport_size({"width": width, "height": height})
        self.problems: list[str] = []
        self.posts: list[tuple[str, Any]] = []
        page = self.page
        page.on(
            "console",
            lambda m: self.problems.append(f"console: {m.text}") if m.type == "error" else None,
        )
        page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))
        page.on("requestfailed", lambda r: self._failed(r))
        page.on("request", lambda r: self._request(r))
        page.goto(f"{url}/playground")

    def _failed(self, request: Any) -> None:
        if "ERR_ABORTED" not in (request.failure or ""):  # a stopped stream is not a fault
            self.problems.append(f"request failed: {request.url} {request.failure}")

    def _request(self, request: Any) -> None:
        if request.method == "POST":
            body = request.post_data
            with contextlib.suppress(ValueError):  # multipart stays as it is
                body = json.loads(body) if body else None
            self.posts.append((request.url.split("/", 3)[-1], body))

    def dataset(self, selector: str) -> dict[str, str]:
        return self.page.eval_on_selector(selector, "e => ({...e.dataset})")

    def close(self) -> None:
        self.page.close()


def _speak_and_wait(tab: Tab) -> dict[str, str]:
    page = tab.page
    page.focus("#speak")  # keyboard, as a person without a mouse would
    page.keyboard.press("Enter")  # the handler marks the status "requesting" before it returns
    assert tab.dataset("#speech-status")["state"] in ("requesting", "streaming")
    page.wait_for_selector(
        "#speech-status[data-state=done], #speech-status[data-state=error]", timeout=60_000
    )
    assert page.inner_text("#speech-error") == ""
    return tab.dataset("#speech-status")


def test_the_playground_speaks_while_streaming_and_draws_the_live_deployment(
    browser, tts_demo, tmp_path
):
    tab = Tab(browser, tts_demo.url)
    page = tab.page
    page.wait_for_selector(READY, timeout=30_000)

    # the deployment view: every stage of the demo inside its process, live within a second
    plan = tts_demo.plan
    for stage in plan.stages:
        node = page.locator(
            f'.stage[data-process="{stage.process}"][data-instance="{stage.instance}"]'
        )
        assert node.count() == 1, stage.instance
        assert stage.instance in node.text_content()
    for process in plan.processes:
        box = page.locator(f'.process[data-process="{process.name}"]')
        assert box.locator("text").first.text_content() == process.name
    page.wait_for_function(
        "() => [...document.querySelectorAll('.stage .stage-live')]"
        ".every(t => /^running \\d+ · waiting \\d+$/.test(t.textContent))"
    )
    page.wait_for_selector('.process[data-state="healthy"]')
    row = page.locator('#process-table tr[data-process="pipeline"]')
    assert "healthy" in row.inner_text()

    # the voices are the server's
    listed = [v["name"] for v in raw("GET", f"{tts_demo.url}/v1/audio/voices").json()["data"]]
    assert page.eval_on_selector_all("#voice option", "os => os.map(o => o.value)") == listed

    # speak: audio plays before the request completes
    page.fill("#speech-text", "Hello from the playground, speaking while the audio streams.")
    # The demo's random weights end some seeds' audio within a fraction of a second, before
    # playback could start; this seed speaks about 13 s of it, for a request that outlasts it.
    page.click("summary")  # "Sampling and more"
    page.fill("#seed", "8")
    first = _speak_and_wait(tab)
    assert first["audioState"] == "running"
    assert int(first["firstAudioMs"]) <= int(first["playingMs"]) < int(first["doneMs"])
    assert first["heardBeforeDone"] == "true"
    assert page.inner_text("#ttfa") == f"{first['firstAudioMs']} ms"
    assert re.fullmatch("\\d+\\.\\d\\d \\(\\d+\\.\\d\u00d7 real time\\)", page.inner_text("#rtf"))
    seconds = float(first["audioSeconds"])
    assert seconds > 0.2
    assert float(first["rtf"]) == pytest.approx(int(first["doneMs"]) / 1000 / seconds, rel=0.01)

    # the download is the streamed WAV with exact sizes; the audio element holds it
    wav = page.evaluate(
        """async () => {
            const link = document.querySelector('#speech-download');
            const bytes = new Uint8Array(await (await fetch(link.href)).arrayBuffer());
            const view = new DataView(bytes.buffer);
            const audio = document.querySelector('#speech-audio');
            if (!(audio.duration > 0)) {
                await new Promise(r => audio.addEventListener('loadedmetadata', r, {once: true}));
            }
            return {name: link.download, size: bytes.length, riff: view.getUint32(4, true),
                    data: view.getUint32(40, true), rate: view.getUint32(24, true),
                    hidden: audio.hidden, duration: audio.duration, src: audio.src};
        }"""
    )
    assert wav["name"].endswith(".wav") and wav["rate"] == 24000
    assert (wav["riff"], wav["data"]) == (wav["size"] - 8, wav["size"] - 44)
    assert wav["data"] == round(seconds * 24000) * 2
    assert not wav["hidden"] and wav["src"].startswith("blob:")
    assert wav["duration"] == pytest.approx(seconds, abs=0.01)

    # another voice changes the request
    page.select_option("#voice", "ryan")
    _speak_and_wait(tab)
    speech = [body for path, body in tab.posts if path == "v1/audio/speech"]
    assert [b["voice"] for b in speech] == [listed[0], "ryan"]
    assert [b["seed"] for b in speech] == [8, 8]
    assert all(b["stream"] is True and b["response_format"] == "wav" for b in speech)

    # in flight per process comes from /metrics
    assert re.fullmatch(
        r"\d+", page.locator('#process-table tr[data-process="pipeline"] td').nth(3).inner_text()
    )

    assert tab.problems == []
    page.screenshot(path=str(tmp_path / "playground.png"), full_page=True)

    # a phone's width: nothing but the picture (in its own scroll box) is wider than the screen
    page.set_viewport_size({"width": 390, "height": 844})
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    page.screenshot(path=str(tmp_path / "playground-phone.png"), full_page=True)
    tab.close()


@pytest.mark.slow
def test_queue_depth_moves_in_the_deployment_view_during_a_burst(browser, tts_demo):
    tab = Tab(browser, tts_demo.url)
    page = tab.page
    page.wait_for_selector(READY, timeout=30_000)
    engine = '.stage[data-stage="tts_engine"]'
    page.wait_for_selector(f'{engine}[data-running="0"]')
    body = json.dumps(
        # Greedy, so every request runs as long as the others: sampled, the random demo
        # weights end some after 15 frames and others after 95, and a burst whose requests
        # mostly ended early was never seen with two running (once, under make test-all's
        # load). Eight of them, about 100 frames each, run together for several refreshes of
        # the view (once a second) however fast the machine is.
        {
            "input": "A burst of requests, to watch the queue.",
            "voice": "serena",
            "max_frames": 200,
            "temperature": 0,
        }
    ).encode()
    results: list[int] = []

    def one() -> None:
        request = urllib.request.Request(
            f"{tts_demo.url}/v1/audio/speech",
            data=body,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            response.read()
            results.append(response.status)

    threads = [threading.Thread(target=one) for _ in range(8)]
    for thread in threads:
        thread.start()
    try:
        page.wait_for_function(
            f"() => Number(document.querySelector('{engine}').dataset.running) >= 2",
            timeout=30_000,
        )
        live = page.locator(f"{engine} .stage-live").text_content()
        assert int(re.match(r"running (\d+)", live).group(1)) >= 2
        # the process table refreshes on its own clock: wait for its view of the burst
        cells = '#process-table tr[data-process="pipeline"] td'  # the 4th: in flight
        page.wait_for_function(
            f"() => Number(document.querySelectorAll('{cells}')[3].innerText) >= 1",
            timeout=30_000,
        )
    finally:
        for thread in threads:
            thread.join(120)
    assert results == [200] * 8
    page.wait_for_function(
        f"() => document.querySelector('{engine}').dataset.running === '0'", timeout=10_000
    )
    assert tab.problems == []
    tab.close()


def test_a_wrong_api_key_gets_a_clear_message_and_the_right_one_is_kept_for_the_tab(
    browser, guarded_server
):
    tab = Tab(browser, guarded_server.url)
    page = tab.page
    page.wait_for_selector("#key-panel:not([hidden])")
    assert page.inner_text("#key-message") == (
        "This server needs an API key. Enter it to use the playground."
    )
    page.fill("#key-input", "not-the-key")
    page.press("#key-input", "Enter")
    page.wait_for_selector('#key-panel[data-reason="invalid"]:not([hidden])')
    assert page.inner_text("#key-message") == (
        "The server refused this API key (invalid API key). Check it and enter it again."
    )
    assert page.evaluate("document.activeElement.id") == "key-input"
    page.fill("#key-input", "sekret")
    page.click("#key-submit")
    page.wait_for_selector(READY, timeout=30_000)
    assert page.is_hidden("#key-panel")
    assert page.evaluate("sessionStorage.getItem('omni.apiKey')") == "sekret"
    assert "sekret" not in page.url
    page.wait_for_selector('.process[data-process="front"][data-state="healthy"]')
    tab.close()


def test_a_chat_answer_streams_word_by_word_with_its_audio(browser, chat_server):
    """t-chat (a test pipeline) streams its reply a word at a time, and speaks it when asked."""
    tab = Tab(browser, chat_server.url)
    page = tab.page
    page.wait_for_selector(READY, timeout=30_000)
    assert page.is_hidden("#speech-panel") and page.is_visible("#chat-speak-field")
    page.check("#chat-speak")
    page.fill("#chat-text", "hello there friend")
    page.press("#chat-text", "Control+Enter")
    page.wait_for_selector("#chat-status[data-state=done]", timeout=30_000)
    status = tab.dataset("#chat-status")
    assert int(status["deltas"]) == 5  # "You said: hello there friend", a word per delta
    assert int(status["firstTokenMs"]) <= int(status["doneMs"])
    answer = page.locator('#chat-log li[data-role="assistant"] .text').inner_text()
    assert answer == "You said: hello there friend"
    assert re.search(r"finish: stop · 0\.[1-9]\d s of audio$", page.inner_text("#chat-status"))
    (body,) = [b for path, b in tab.posts if path == "v1/chat/completions"]
    assert body["modalities"] == ["text", "audio"] and body["audio"] == {"format": "pcm16"}
    assert body["messages"] == [{"role": "user", "content": "hello there friend"}]
    assert tab.problems == []
    tab.close()


# The WAV behind an answer's player, read back from its blob URL: its rate and seconds.
READ_WAV = """async (url) => {
    const bytes = new Uint8Array(await (await fetch(url)).arrayBuffer());
    const view = new DataView(bytes.buffer);
    const tag = (at) => String.fromCharCode(...bytes.subarray(at, at + 4));
    return {riff: tag(0), wave: tag(8), data: tag(36), rate: view.getUint32(24, true),
            bytes: view.getUint32(40, true), length: bytes.length};
}"""


def _answer_audio(tab: Tab, answer: Any) -> tuple[dict[str, Any], float]:
    """The answer's <audio> and download: one blob URL, and what the WAV there holds."""
    audio = answer.locator("audio")
    assert audio.count() == 1
    assert audio.evaluate("a => a.controls") is True
    src = audio.get_attribute("src")
    assert src.startswith("blob:")
    link = answer.locator("a[download]")
    assert link.get_attribute("download") == "answer.wav"
    assert link.get_attribute("href") == src
    assert link.is_visible() and audio.is_visible()
    wav = tab.page.evaluate(READ_WAV, src)
    assert (wav["riff"], wav["wave"], wav["data"]) == ("RIFF", "WAVE", "data")
    assert wav["length"] == 44 + wav["bytes"]
    audio.evaluate(
        "a => a.readyState >= 1 || new Promise(r => a.addEventListener('loadedmetadata', r))"
    )
    return wav, audio.evaluate("a => a.duration")


def test_every_chat_answer_with_audio_gets_a_player_and_a_wav_download(browser, chat_server):
    """The status's "N s of audio" is there to hear again and to keep: each answer that had
    audio carries an <audio> over a WAV blob of exactly that audio, and "answer.wav"."""
    tab = Tab(browser, chat_server.url)
    page = tab.page
    page.wait_for_selector(READY, timeout=30_000)
    rate = raw("GET", f"{chat_server.url}/v1/deployment").json()["sample_rate"]
    answers = page.locator('#chat-log li[data-role="assistant"]')
    page.check("#chat-speak")
    for turn, text in enumerate(["hello there friend", "and once more, with feeling"]):
        page.fill("#chat-text", text)
        page.click("#chat-send")
        page.wait_for_function(
            f"() => document.querySelectorAll('#chat-log li[data-role=assistant]').length"
            f" === {turn + 1} && document.querySelector('#chat-status').dataset.state === 'done'",
            timeout=30_000,
        )
        said = float(re.search(r"([\d.]+) s of audio$", page.inner_text("#chat-status"))[1])
        assert said > 0
        wav, duration = _answer_audio(tab, answers.nth(turn))
        assert wav["rate"] == rate
        assert wav["bytes"] / (2 * rate) == pytest.approx(said, abs=0.006)
        assert duration == pytest.approx(said, abs=0.02)
    first, second = (answers.nth(i).locator("audio").get_attribute("src") for i in (0, 1))
    assert first != second  # each answer keeps its own audio
    # an answer without audio gets no player
    page.uncheck("#chat-speak")
    page.fill("#chat-text", "quietly now")
    page.click("#chat-send")
    page.wait_for_function(
        "() => document.querySelectorAll('#chat-log li[data-role=assistant]').length === 3"
        " && document.querySelector('#chat-status').dataset.state === 'done'",
        timeout=30_000,
    )
    assert answers.nth(2).locator("audio, a[download]").count() == 0
    assert tab.problems == []
    tab.close()


def test_the_speech_card_says_a_tts_pipeline_reads_the_text_aloud(browser, tts_demo):
    tab = Tab(browser, tts_demo.url)
    page = tab.page
    page.wait_for_selector(READY, timeout=30_000)
    assert raw("GET", f"{tts_demo.url}/v1/deployment").json()["speech_input"] == "read"
    label = page.inner_text('label[for="speech-text"]')
    assert "speak" in label.lower() and "answer" not in label.lower()
    assert page.inner_text("#speak") == "Speak"
    assert tab.dataset("#speech-panel")["speechInput"] == "read"
    assert tab.problems == []
    tab.close()


def test_the_plan_picture_is_legible_in_a_browser(browser, tmp_path, capsys):
    """``omni plan --format svg`` of the seven-process, two-GPU Qwen3-Omni plan, rendered:
    every label fits inside its box with the browser's real fonts."""
    target = tmp_path / "qwen3_omni.svg"
    args = ["--no-detect", "--gpus", "2", "--gpu-memory", "141GiB", "--format", "svg"]
    assert main(["plan", str(EXAMPLES / "qwen3_omni.toml"), *args, "-o", str(target)]) == 0
    svg = target.read_text()
    names = {t.text for t in ET.fromstring(svg).iter("{http://www.w3.org/2000/svg}text")}
    assert {"thinker", "talker_ar", "code2wav", "GPU 0", "GPU 1"} <= names
    page = browser.new_page()
    page.set_viewport_size({"width": 1700, "height": 700})
    page.set_content(f"<!DOCTYPE html><body style='margin:0'>{svg}</body>")
    overflow = page.evaluate(
        """() => {
            const out = [];
            for (const group of document.querySelectorAll('g.process, g.stage')) {
                const box = group.querySelector('rect').getBBox();
                for (const text of group.querySelectorAll(':scope > text')) {
                    const b = text.getBBox();
                    if (b.width && (b.x < box.x || b.x + b.width > box.x + box.width)) {
                        out.push(text.textContent);
                    }
                }
            }
            return out;
        }"""
    )
    assert overflow == []
    page.locator("svg").screenshot(path=str(tmp_path / "plan.png"))
    page.close()


@pytest.mark.slow
def test_qwen3_omni_answers_an_image_and_a_question_as_a_stream(browser, tmp_path):
    png = tmp_path / "picture.png"
    from PIL import Image

    Image.new("RGB", (48, 32), (200, 40, 40)).save(png)
    with _serve(EXAMPLES / "qwen3_omni_text_demo.toml") as live:
        tab = Tab(browser, live.url)
        page = tab.page
        page.wait_for_selector(READY, timeout=30_000)
        assert page.is_hidden("#speech-panel") and page.is_visible("#chat-panel")
        page.set_input_files("#chat-image", str(png))
        page.wait_for_selector("#chat-attachments li")
        page.fill("#chat-text", "What is in this picture?")
        page.fill("#chat-max-tokens", "8")
        page.fill("#chat-temperature", "0")  # greedy: a sampled answer's length varies
        page.click("#chat-send")
        page.wait_for_selector("#chat-status[data-state=done]", timeout=60_000)
        status = tab.dataset("#chat-status")
        assert int(status["firstTokenMs"]) < int(status["doneMs"])
        assert int(status["deltas"]) >= 2  # streamed, piece by piece
        answer = page.locator('#chat-log li[data-role="assistant"] .text').inner_text()
        assert answer.strip()
        (body,) = [b for path, b in tab.posts if path == "v1/chat/completions"]
        assert body["stream"] is True
        parts = body["messages"][-1]["content"]
        assert parts[0]["image_url"]["url"].startswith("data:image/png;base64,")
        assert parts[-1] == {"type": "text", "text": "What is in this picture?"}
        assert page.locator('#chat-log li[data-role="user"] img').count() == 1
        assert tab.problems == []
        page.screenshot(path=str(tmp_path / "chat.png"), full_page=True)
        tab.close()


@pytest.mark.slow
def test_qwen3_omni_answers_a_video_upload(browser, tmp_path):
    """The chat panel's Video input sends the file as a video_url data: URL and shows it in
    the conversation (from a blob: URL, which the page's CSP allows), and the model answers."""
    import fractions

    av = pytest.importorskip("av")
    clip = tmp_path / "clip.mp4"
    with av.open(str(clip), "w") as container:
        stream = container.add_stream("libx264", rate=10)
        stream.width, stream.height, stream.pix_fmt = 96, 64, "yuv420p"
        stream.time_base = fractions.Fraction(1, 10)
        for k in range(10):
            frame = av.VideoFrame(96, 64, "yuv420p")
            for plane in frame.planes:
                plane.update(bytes([20 * k]) * plane.buffer_size)
            frame.pts = k
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    with _serve(EXAMPLES / "qwen3_omni_text_demo.toml") as live:
        tab = Tab(browser, live.url)
        page = tab.page
        page.wait_for_selector(READY, timeout=30_000)
        page.set_input_files("#chat-video", str(clip))
        page.wait_for_selector("#chat-attachments li")
        assert "video clip.mp4" in page.inner_text("#chat-attachments")
        page.fill("#chat-text", "What happens?")
        page.fill("#chat-max-tokens", "4")
        page.click("#chat-send")
        page.wait_for_selector("#chat-status[data-state=done]", timeout=90_000)
        (body,) = [b for path, b in tab.posts if path == "v1/chat/completions"]
        parts = body["messages"][-1]["content"]
        assert parts[0]["type"] == "video_url"
        assert parts[0]["video_url"]["url"].startswith("data:video/mp4;base64,")
        assert parts[-1] == {"type": "text", "text": "What happens?"}
        assert page.locator('#chat-log li[data-role="user"] video').count() == 1
        assert page.locator("#chat-attachments li").count() == 0
        assert page.is_hidden("#chat-error")
        assert tab.problems == []
        tab.close()


@pytest.mark.slow
def test_the_seven_process_qwen3_omni_demo_speaks_its_answer_and_shows_every_process(
    browser, qwen3_omni_demo, tmp_path
):
    tab = Tab(browser, qwen3_omni_demo.url)
    page = tab.page
    page.wait_for_selector(READY, timeout=30_000)
    assert page.locator(".process").count() == 7
    page.wait_for_function(
        "() => document.querySelectorAll('.process[data-state=\"healthy\"]').length === 7"
    )
    page.fill("#chat-text", "Say something.")
    page.fill("#chat-max-tokens", "8")
    # greedy: sampled, the random talker ends its speech at the first frame now and then
    page.fill("#chat-temperature", "0")
    page.check("#chat-speak")
    page.click("#chat-send")
    page.wait_for_selector("#chat-status[data-state=done]", timeout=90_000)
    said = float(re.search(r"([\d.]+) s of audio$", page.inner_text("#chat-status"))[1])
    (body,) = [b for path, b in tab.posts if path == "v1/chat/completions"]
    assert body["modalities"] == ["text", "audio"]
    assert body["audio"]["format"] == "pcm16"
    # the answer's audio, to play again or download
    wav, _ = _answer_audio(tab, page.locator('#chat-log li[data-role="assistant"]'))
    assert wav["rate"] == 24000
    assert wav["bytes"] / (2 * 24000) == pytest.approx(said, abs=0.006)
    assert tab.problems == []
    page.screenshot(path=str(tmp_path / "qwen3-omni.png"), full_page=True)
    tab.close()


# Every piece of text in the deployment view with the size it is drawn at: an SVG text's
# font size times the picture's scale on screen; hidden ones (a column a phone drops) skipped.
RENDERED_TEXT = """() => {
    const panel = document.getElementById('deployment-panel');
    const walker = document.createTreeWalker(panel, NodeFilter.SHOW_TEXT);
    const out = [];
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
        const el = node.parentElement;
        if (!node.textContent.trim() || !el.getClientRects().length) continue;
        let size = parseFloat(getComputedStyle(el).fontSize);
        if (el instanceof SVGElement) size *= el.getScreenCTM().a;
        out.push([node.textContent.trim(), size]);
    }
    return out;
}"""

# The words of the process table that a line break cuts in two, and the process names
# wider than their cell.
BROKEN_WORDS = r"""() => {
    const broken = [];
    for (const cell of document.querySelectorAll('#process-table tbody :is(th, td)')) {
        if (!cell.getClientRects().length) continue;
        if (cell.scope === 'row' && cell.scrollWidth > cell.clientWidth) {
            broken.push(cell.textContent);
        }
        for (const node of cell.childNodes) {
            if (node.nodeType !== Node.TEXT_NODE) continue;
            for (const word of node.textContent.matchAll(/\S+/g)) {
                const range = document.createRange();
                range.setStart(node, word.index);
                range.setEnd(node, word.index + word[0].length);
                const lines = new Set([...range.getClientRects()].map(r => Math.round(r.top)));
                if (lines.size > 1) broken.push(word[0]);
            }
        }
    }
    return broken;
}"""


@pytest.mark.slow
def test_on_a_phone_the_seven_process_deployment_stays_readable_and_speech_says_it_answers(
    browser, qwen3_omni_demo, tmp_path
):
    """390 px wide: the picture scrolls sideways at a readable scale (no text under 11 px)
    instead of shrinking to fit, the page itself does not scroll sideways, and no word of
    the process table is broken. Qwen3-Omni's Speech card says the model answers the text."""
    tab = Tab(browser, qwen3_omni_demo.url, width=390, height=844)
    page = tab.page
    page.wait_for_selector(READY, timeout=30_000)
    page.wait_for_function(
        "() => document.querySelectorAll('.process[data-state=\"healthy\"]').length === 7"
        " && document.querySelectorAll('#process-table td[data-state=healthy]').length === 7"
    )
    texts = page.evaluate(RENDERED_TEXT)
    names = {text for text, _ in texts}
    assert {"preprocessing", "thinker", "talker_ar", "code2wav"} <= names
    assert len(texts) > 40  # the picture's labels and the table's cells, all measured
    assert [(text, round(size, 1)) for text, size in texts if size < 11] == []
    assert page.evaluate(BROKEN_WORDS) == []
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    picture = page.locator("#deployment-picture")
    assert picture.evaluate("e => e.scrollWidth > e.clientWidth")  # it scrolls instead
    assert picture.evaluate("e => getComputedStyle(e).overflowX") == "auto"

    assert raw("GET", f"{qwen3_omni_demo.url}/v1/deployment").json()["speech_input"] == "answer"
    assert page.is_visible("#speech-panel")
    label = page.inner_text('label[for="speech-text"]')
    assert "answer" in label.lower() and label != "Text to speak"
    assert page.inner_text("#speak") == "Ask"
    assert tab.dataset("#speech-panel")["speechInput"] == "answer"
    assert tab.problems == []
    page.screenshot(path=str(tmp_path / "qwen3-omni-phone.png"), full_page=True)
    tab.close()


@pytest.mark.slow
def test_a_voice_recorded_from_the_microphone_is_cloned_with_consent_and_spoken(browser, tmp_path):
    """MOSS-TTS clones: the page records Chromium's fake microphone, uploads the clip as WAV
    only once the consent box is ticked, and the new voice speaks."""
    flags = ["--server.voices_dir", str(tmp_path / "voices")]
    with _serve(EXAMPLES / "moss_tts_demo.toml", flags) as live:
        tab = Tab(browser, live.url)
        page = tab.page
        page.wait_for_selector(READY, timeout=30_000)
        assert page.is_visible("#clone-form") and page.is_hidden("#clone-off")
        page.fill("#clone-name", "me")
        page.click("#clone-record")
        page.wait_for_selector('#clone-record[aria-pressed="true"]')  # the microphone is on
        page.wait_for_timeout(2000)
        page.click("#clone-record")
        page.wait_for_function(
            "() => document.querySelector('#clone-clip').textContent.startsWith('Recorded')"
        )
        page.click("#clone-save")  # consent not given: the browser keeps the form
        assert page.evaluate("document.querySelector('#clone-consent').validity.valueMissing")
        assert [p for p, _ in tab.posts if p == "v1/audio/voices"] == []
        page.check("#clone-consent")
        page.click("#clone-save")
        page.wait_for_function(
            "() => /Saved|Not saved/.test(document.querySelector('#clone-status').textContent)",
            timeout=120_000,
        )
        assert page.inner_text("#clone-status") == "Saved voice me."
        assert page.input_value("#voice") == "me"
        stored = json.loads((tmp_path / "voices" / "me" / "voice.json").read_text())
        assert stored["consent"] is True and 1.5 < stored["duration"] < 3.5
        _speak_and_wait(tab)
        speech = [b for p, b in tab.posts if p == "v1/audio/speech"]
        assert speech[-1]["voice"] == "me"
        assert tab.problems == []
        page.screenshot(path=str(tmp_path / "clone.png"), full_page=True)
        tab.close()


def test_talk_opens_the_realtime_socket_with_the_key_and_says_why_a_wrong_key_fails(
    browser, guarded_server
):
    """t-speech serves chat, so the Talk panel shows; starting it opens /v1/realtime with the
    tab's key as a subprotocol (the route is guarded: a connection proves the key went along),
    sends its session settings, then the microphone in 100 ms appends; a wrong key is said."""
    tab = Tab(browser, guarded_server.url)
    page = tab.page
    page.wait_for_selector("#key-panel:not([hidden])")
    page.fill("#key-input", "sekret")
    page.click("#key-submit")
    page.wait_for_selector(READY, timeout=30_000)
    assert page.is_visible("#talk-panel") and page.is_visible("#chat-panel")
    sent: list[dict[str, Any]] = []
    sockets: list[Any] = []

    def opened(ws: Any) -> None:
        sockets.append(ws)
        ws.on("framesent", lambda payload: sent.append(json.loads(payload)))

    page.on("websocket", opened)
    page.click("#talk-toggle")
    page.wait_for_selector('#talk-status[data-state="listening"][data-session="updated"]')
    assert page.get_attribute("#talk-toggle", "aria-pressed") == "true"
    assert page.inner_text("#talk-toggle") == "Stop talking"
    page.wait_for_timeout(500)  # a few appends go out
    assert [ws.url.split("/", 3)[-1] for ws in sockets] == ["v1/realtime"]
    update = sent[0]
    assert update["type"] == "session.update"
    audio = update["session"]["audio"]
    assert audio["input"]["turn_detection"] == {"type": "server_vad"}
    assert audio["input"]["transcription"] and audio["input"]["format"]["rate"] == 24000
    appends = [e for e in sent if e["type"] == "input_audio_buffer.append"]
    assert len(appends) >= 3
    assert {len(base64.b64decode(e["audio"])) for e in appends} == {4800}  # 100 ms at 24 kHz
    assert page.is_hidden("#talk-error")

    page.click("#talk-toggle")
    page.wait_for_selector('#talk-status[data-state="idle"]')
    assert page.inner_text("#talk-toggle") == "Start talking"
    if not sockets[0].is_closed():  # the page is idle at once; the close handshake may trail it
        sockets[0].wait_for_event("close", timeout=10_000)
    assert sockets[0].is_closed()

    page.evaluate("sessionStorage.setItem('omni.apiKey', 'not-the-key')")
    page.click("#talk-toggle")
    page.wait_for_selector('#talk-status[data-state="error"]')
    error = page.inner_text("#talk-error")
    assert error.startswith("The server did not take the connection (code 1006)")
    assert "the API key was refused" in error
    assert page.get_attribute("#talk-toggle", "aria-pressed") == "false"
    assert page.is_enabled("#talk-toggle")
    # the browser logs the refused handshake, and the live view's polls with the wrong key
    expected = ("WebSocket connection", "status of 401 (Unauthorized)")
    assert [p for p in tab.problems if not any(e in p for e in expected)] == []

    page.set_viewport_size({"width": 390, "height": 844})
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    tab.close()


def _spoken_wav(text: str, path: Path) -> Path:
    """``text`` said by espeak-ng, with 1 s of silence before and 20 s after (Chromium loops the
    file: the silence keeps the person from speaking again while the test watches)."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (apt-get install espeak-ng)")
    np = pytest.importorskip("numpy")
    sf = pytest.importorskip("soundfile")
    raw_path = path.with_suffix(".raw.wav")
    subprocess.run(["espeak-ng", "-w", str(raw_path), text], check=True)
    speech, rate = sf.read(raw_path, dtype="int16")
    padded = np.concatenate([np.zeros(rate, np.int16), speech, np.zeros(20 * rate, np.int16)])
    sf.write(path, padded, rate, subtype="PCM_16")
    return path


@pytest.mark.slow
def test_talking_to_qwen3_omni_shows_both_turns_the_latency_and_plays_the_answer(
    chromium, tmp_path
):
    """The seven-process Qwen3-Omni demo, spoken to through Chromium's fake microphone (a WAV
    of espeak-ng speech): the server's VAD finds the turn, the page shows the user's words as
    transcribed, the answer's transcript, the turn latency, and the answer's audio is played
    by the AudioContext's clock."""
    wav = _spoken_wav("Hello there, tell me a story.", tmp_path / "hello.wav")
    args = [*CHROMIUM_ARGS, f"--use-file-for-fake-audio-capture={wav}"]
    with _serve(EXAMPLES / "qwen3_omni_demo.toml") as live:
        # a browser of its own: the fake microphone's file is a launch flag
        talker = chromium.browser_type.launch(executable_path=CHROMIUM, args=args)
        try:
            tab = Tab(talker.new_context(), live.url)
            page = tab.page
            page.wait_for_selector(READY, timeout=30_000)
            page.click("#talk-panel summary")
            page.fill("#talk-max-tokens", "8")
            # greedy: sampled, the random talker ends its speech at the first frame now and then
            page.fill("#talk-temperature", "0")
            page.click("#talk-toggle")
            page.wait_for_selector('#talk-status[data-session="updated"]', timeout=30_000)
            user = '#talk-log li[data-role="user"]'
            page.wait_for_selector(f'{user}[data-transcript="done"]', timeout=60_000)
            assert page.locator(user).count() == 1  # one turn heard, not a turn per word
            assert page.locator(f"{user} .text").inner_text().strip()
            answer = '#talk-log li[data-role="assistant"]'
            page.wait_for_selector(f"{answer}[data-latency-ms]", timeout=60_000)
            page.wait_for_function(
                "() => Number(document.querySelector('#talk-status').dataset.answers) >= 1"
                " && Number(document.querySelector('#talk-status').dataset.heardMs) > 0",
                timeout=60_000,
            )
            status = tab.dataset("#talk-status")
            latency = int(status["latencyMs"])
            assert 0 < latency < 30_000
            assert page.inner_text("#talk-latency") == f"{latency} ms"
            assert page.locator(f"{answer} .text").first.inner_text().strip()
            assert int(status["audioDeltas"]) >= 1 and int(status["audioMs"]) > 0
            assert 0 < int(status["heardMs"]) <= int(status["audioMs"]) + 1
            assert status["audioContext"] == "running"
            assert status["bargeIns"] == "0"
            assert page.is_hidden("#talk-error")
            assert tab.problems == []
            page.screenshot(path=str(tmp_path / "talk.png"), full_page=True)
            page.click("#talk-toggle")
            page.wait_for_selector('#talk-status[data-state="idle"]')
            tab.close()
        finally:
            talker.close()
