// The chat panel: POST /v1/chat/completions with text, an image, a video and a recorded clip, the
// answer streamed (SSE) as text and, when asked and the pipeline speaks, as PCM16 audio
// played as it arrives, then kept under the answer as a WAV to replay or download. The
// conversation is kept here and sent whole with each turn.

import { ApiError, describe } from "./api.js";
import { microphoneProblem, record } from "./recorder.js";
import { events } from "./sse.js";
import { base64, concat, fromBase64, wavHeader } from "./wav.js";

const $ = (id) => document.getElementById(id);
const MAX_IMAGE_BYTES = 16 * 1024 * 1024;
// base64 grows a file by a third: 20 MiB stays under the server's default 32 MiB body
const MAX_VIDEO_BYTES = 20 * 1024 * 1024;

function readAsDataUrl(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

export class ChatPanel {
  constructor(api, deployment, player, voices) {
    this.api = api;
    this.deployment = deployment;
    this.player = player;
    this.voices = voices; // the speech panel's listing, when the pipeline serves speech
    this.history = [];
    this.image = null; // { url, name }
    this.video = null; // { url, name, file }
    this.audio = null; // { data (base64 wav), seconds }
    this.recording = null;
    this.controller = null;
    this.urls = []; // the answers' WAV blob URLs, revoked with the conversation
  }

  init() {
    $("chat-panel").hidden = false;
    const outputs = this.deployment.outputs;
    if (outputs.audio) {
      $("chat-speak-field").hidden = false;
      if (!outputs.text) {
        // the pipeline answers only in audio (its transcript is the text shown)
        $("chat-speak").checked = true;
        $("chat-speak").disabled = true;
      }
      const names = this.voices ? this.voices.data.map((v) => v.name) : [];
      if (names.length) {
        $("chat-voice-field").hidden = false;
        $("chat-voice").replaceChildren(...names.map((name) => new Option(name, name)));
      }
    }
    $("chat-form").addEventListener("submit", (event) => {
      event.preventDefault();
      this.send();
    });
    $("chat-text").addEventListener("keydown", (event) => {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
        event.preventDefault();
        this.send();
      }
    });
    $("chat-image").addEventListener("change", () => this.attachImage());
    $("chat-video").addEventListener("change", () => this.attachVideo());
    $("chat-stop").addEventListener("click", () => this.stop());
    this.player.addEventListener("idle", () => {
      if (!this.controller) $("chat-stop").disabled = true;
    });
    $("chat-clear").addEventListener("click", () => {
      this.stop();
      this.history = [];
      $("chat-log").replaceChildren();
      for (const url of this.urls) URL.revokeObjectURL(url);
      this.urls = [];
      this.status("", "idle");
    });
    const problem = microphoneProblem();
    if (problem) {
      $("chat-record").disabled = true;
      $("chat-record").title = problem;
    }
    $("chat-record").addEventListener("click", () => this.toggleRecording());
  }

  status(text, state, data = {}) {
    const node = $("chat-status");
    node.textContent = text;
    node.dataset.state = state;
    Object.assign(node.dataset, data);
  }

  showError(message) {
    $("chat-error").textContent = message;
    $("chat-error").hidden = !message;
  }

  // -- attachments ----------------------------------------------------------------------------

  async attachImage() {
    const file = $("chat-image").files[0];
    if (!file) return;
    if (file.size > MAX_IMAGE_BYTES) {
      this.showError(`${file.name} is over ${MAX_IMAGE_BYTES >> 20} MiB.`);
      return;
    }
    this.image = { url: await readAsDataUrl(file), name: file.name };
    this.renderAttachments();
  }

  async attachVideo() {
    const file = $("chat-video").files[0];
    if (!file) return;
    if (file.size > MAX_VIDEO_BYTES) {
      this.showError(`${file.name} is over ${MAX_VIDEO_BYTES >> 20} MiB.`);
      $("chat-video").value = "";
      return;
    }
    // shown from a blob: URL (the page's CSP allows media from blob:, not data:)
    this.video = { url: await readAsDataUrl(file), name: file.name, file };
    this.renderAttachments();
  }

  async toggleRecording() {
    const button = $("chat-record");
    if (this.recording) {
      const recording = this.recording;
      this.recording = null;
      button.textContent = "Record audio";
      button.setAttribute("aria-pressed", "false");
      try {
        const { wav, seconds } = await recording.stop(16000);
        this.audio = { data: base64(wav), seconds };
        this.renderAttachments();
      } catch (error) {
        this.showError(`The recording could not be read: ${describe(error)}`);
      }
      return;
    }
    try {
      this.recording = await record();
    } catch (error) {
      this.showError(`The microphone is not available: ${describe(error)}`);
      return;
    }
    button.textContent = "Stop recording";
    button.setAttribute("aria-pressed", "true");
  }

  renderAttachments() {
    const list = $("chat-attachments");
    list.replaceChildren();
    const item = (label, onRemove, image = null) => {
      const li = document.createElement("li");
      if (image) {
        const img = document.createElement("img");
        img.src = image;
        img.alt = "";
        li.append(img);
      }
      li.append(document.createTextNode(label));
      const remove = document.createElement("button");
      remove.type = "button";
      remove.className = "secondary";
      remove.textContent = "Remove";
      remove.setAttribute("aria-label", `Remove ${label}`);
      remove.addEventListener("click", () => {
        onRemove();
        this.renderAttachments();
      });
      li.append(remove);
      list.append(li);
    };
    if (this.image) {
      item(`image ${this.image.name}`, () => {
        this.image = null;
        $("chat-image").value = "";
      }, this.image.url);
    }
    if (this.video) {
      item(`video ${this.video.name}`, () => {
        this.video = null;
        $("chat-video").value = "";
      });
    }
    if (this.audio) item(`audio ${this.audio.seconds.toFixed(1)} s`, () => (this.audio = null));
  }

  // -- one turn -------------------------------------------------------------------------------

  entry(role, text = "") {
    const li = document.createElement("li");
    li.dataset.role = role;
    const who = document.createElement("span");
    who.className = "who";
    who.textContent = role === "user" ? "You" : this.deployment.model;
    const body = document.createElement("span");
    body.className = "text";
    body.textContent = text;
    li.append(who, body);
    $("chat-log").append(li);
    return li;
  }

  async send() {
    const text = $("chat-text").value.trim();
    if (!text && !this.image && !this.video && !this.audio) {
      this.showError("Write a message, or attach an image, a video or a recording.");
      return;
    }
    const speak = $("chat-speak").checked && this.deployment.outputs.audio;
    if (speak) this.player.unlock(); // inside the gesture
    this.stop();
    this.showError("");
    const parts = [];
    if (this.image) parts.push({ type: "image_url", image_url: { url: this.image.url } });
    if (this.video) parts.push({ type: "video_url", video_url: { url: this.video.url } });
    if (this.audio) parts.push({ type: "input_audio", input_audio: { data: this.audio.data, format: "wav" } });
    if (text) parts.push({ type: "text", text });
    const content = parts.length === 1 && text ? text : parts;
    const shown = this.entry("user", text);
    if (this.image) {
      const img = document.createElement("img");
      img.src = this.image.url;
      img.alt = `attached image ${this.image.name}`;
      shown.append(img);
    }
    if (this.video) {
      const video = document.createElement("video");
      video.src = URL.createObjectURL(this.video.file);
      this.urls.push(video.src);
      video.controls = true;
      video.muted = true;
      video.setAttribute("aria-label", `attached video ${this.video.name}`);
      shown.append(video);
    }
    if (this.audio) shown.append(document.createTextNode(`\n[audio ${this.audio.seconds.toFixed(1)} s]`));
    this.history.push({ role: "user", content });
    $("chat-text").value = "";
    this.image = null;
    this.video = null;
    this.audio = null;
    $("chat-image").value = "";
    $("chat-video").value = "";
    this.renderAttachments();

    const body = { messages: this.history, stream: true, stream_options: { include_usage: true } };
    const maxTokens = $("chat-max-tokens").value;
    if (maxTokens) body.max_tokens = Number.parseInt(maxTokens, 10);
    const temperature = $("chat-temperature").value;
    if (temperature !== "") body.temperature = Number(temperature);
    if (speak) {
      body.modalities = this.deployment.outputs.text ? ["text", "audio"] : ["audio"];
      body.audio = { format: "pcm16" };
      if (!$("chat-voice-field").hidden) body.audio.voice = $("chat-voice").value;
      this.player.reset(this.deployment.sample_rate || 24000);
    }

    const answer = this.entry("assistant");
    const out = answer.querySelector(".text");
    const controller = new AbortController();
    this.controller = controller;
    for (const key of ["deltas", "firstTokenMs", "doneMs"]) delete $("chat-status").dataset[key];
    $("chat-send").disabled = true;
    $("chat-stop").disabled = false;
    const started = performance.now();
    let first = null;
    let reply = "";
    let finish = null;
    let usage = null;
    let deltas = 0;
    const pcm = []; // the answer's PCM16, for the player under it once it ends
    this.status("Thinking…", "requesting");
    $("chat-log").setAttribute("aria-busy", "true"); // read the answer once, when it is whole
    try {
      const response = await this.api.fetch("v1/chat/completions", {
        method: "POST",
        json: body,
        signal: controller.signal,
      });
      for await (const chunk of events(response)) {
        if (chunk.error) throw new ApiError(chunk.error.status || 500, chunk.error.message);
        if (chunk.usage) usage = chunk.usage;
        for (const choice of chunk.choices || []) {
          const delta = choice.delta || {};
          const piece = delta.content || (delta.audio && delta.audio.transcript) || "";
          if (piece) {
            reply += piece;
            out.textContent = reply;
            deltas += 1;
            $("chat-status").dataset.deltas = String(deltas);
          }
          if (delta.audio && delta.audio.data) {
            const bytes = fromBase64(delta.audio.data);
            pcm.push(bytes);
            this.player.push(bytes);
          }
          if ((piece || (delta.audio && delta.audio.data)) && first === null) {
            first = performance.now() - started;
            this.status("Answering…", "streaming", { firstTokenMs: String(Math.round(first)) });
          }
          if (choice.finish_reason) finish = choice.finish_reason;
        }
      }
    } catch (error) {
      if (error.name !== "AbortError") {
        this.showError(describe(error));
        this.status("Failed.", "error");
      }
      if (!reply) {
        answer.remove();
        this.history.pop();
      } else {
        this.offerAudio(answer, pcm); // a stopped answer keeps what it said
      }
      return;
    } finally {
      $("chat-log").setAttribute("aria-busy", "false");
      if (this.controller === controller) this.controller = null;
      $("chat-send").disabled = false;
      $("chat-stop").disabled = !this.player.playing;
    }
    this.history.push({ role: "assistant", content: reply });
    const elapsed = performance.now() - started;
    const figures = [`first token ${Math.round(first ?? elapsed)} ms`, `done in ${Math.round(elapsed)} ms`];
    if (usage) figures.push(`${usage.completion_tokens} tokens`);
    if (finish) figures.push(`finish: ${finish}`);
    if (speak) figures.push(`${this.player.seconds.toFixed(2)} s of audio`);
    this.offerAudio(answer, pcm);
    this.status(figures.join(" · "), "done", { doneMs: String(Math.round(elapsed)) });
  }

  /** Under an answer that had audio: a player with controls and an "answer.wav" download. */
  offerAudio(answer, pcm) {
    const bytes = concat(pcm);
    if (bytes.length < 2 || !answer.isConnected) return; // none, or "New chat" took it away
    const rate = this.deployment.sample_rate || 24000; // what the player was reset to
    const data = bytes.subarray(0, bytes.length - (bytes.length % 2));
    const wav = concat([wavHeader(rate, data.length), data]);
    const url = URL.createObjectURL(new Blob([wav], { type: "audio/wav" }));
    this.urls.push(url);
    const box = document.createElement("span");
    box.className = "answer-audio";
    const audio = document.createElement("audio");
    audio.controls = true;
    audio.preload = "metadata";
    audio.src = url;
    audio.setAttribute("aria-label", "The answer's audio");
    const link = document.createElement("a");
    link.href = url;
    link.download = "answer.wav";
    link.textContent = "Download answer.wav";
    box.append(audio, link);
    answer.append(box);
  }

  stop() {
    if (this.controller) this.controller.abort();
    this.controller = null;
    this.player.stop();
    $("chat-send").disabled = false;
    $("chat-stop").disabled = true;
  }
}
