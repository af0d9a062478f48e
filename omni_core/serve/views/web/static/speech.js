// The speech panel: text in, audio out through POST /v1/audio/speech, heard while it streams.
//
// wav and pcm are played as they arrive (WebAudio, see player.js); the other formats are
// collected and played once complete. The page measures what a user feels: the time from
// pressing Speak to the first audio bytes, and the real-time factor (request time over
// seconds of audio). Voices come from GET /v1/audio/voices; a model that clones gets a
// form to record or upload a clip, with the consent the voices API requires.

import { describe } from "./api.js";
import { microphoneProblem, record } from "./recorder.js";
import { concat, fixWavSizes, parseWavHeader, wavHeader } from "./wav.js";

const $ = (id) => document.getElementById(id);
const LIVE = new Set(["wav", "pcm"]);
const EXTENSION = { wav: "wav", pcm: "pcm", flac: "flac", mp3: "mp3", opus: "ogg", aac: "aac" };
const MEDIA = {
  wav: "audio/wav",
  pcm: "audio/wav", // offered to the <audio> element wrapped in a WAV header
  flac: "audio/flac",
  mp3: "audio/mpeg",
  opus: "audio/ogg",
  aac: "audio/aac",
};

function ms(value) {
  return `${Math.round(value)} ms`;
}

/** A number field's value, or undefined when left empty (the model's default applies). */
function number(id, integer = false) {
  const input = $(id);
  if (input.value.trim() === "") return undefined;
  const value = integer ? Number.parseInt(input.value, 10) : Number(input.value);
  if (!Number.isFinite(value)) throw new Error(`${input.labels[0].textContent}: not a number`);
  return value;
}

export class SpeechPanel {
  constructor(api, deployment, player) {
    this.api = api;
    this.deployment = deployment;
    this.player = player;
    this.voices = null;
    this.controller = null;
    this.recording = null;
    this.clip = null;
    this.urls = [];
  }

  async init() {
    $("speech-panel").hidden = false;
    this.describeInput();
    $("speech-form").addEventListener("submit", (event) => {
      event.preventDefault();
      this.speak();
    });
    $("speech-stop").addEventListener("click", () => this.stop("Stopped."));
    this.player.addEventListener("idle", () => {
      if (!this.controller) $("speech-stop").disabled = true;
    });
    $("voice").addEventListener("change", () => this.voiceChanged());
    await this.loadVoices();
    this.initClone();
    return this.voices;
  }

  /** Say what the pipeline does with the text: read it aloud (TTS), or answer it aloud
   * (Qwen3-Omni's speech API takes the text as the user's turn). */
  describeInput() {
    const answers = this.deployment.speech_input === "answer";
    $("speech-panel").dataset.speechInput = answers ? "answer" : "read";
    $("speech-text-label").textContent = answers
      ? "Message for the model (it answers aloud)"
      : "Text to speak";
    $("speak").textContent = answers ? "Ask" : "Speak";
    if (answers) $("speech-text").value = "Hello! Say one short sentence about the sea.";
  }

  // -- voices -------------------------------------------------------------------------------

  async loadVoices(select = null) {
    try {
      this.voices = await this.api.json("v1/audio/voices");
    } catch (error) {
      this.voices = { data: [], aliases: {}, cloning: false, uploads: false, builtin_known: false };
      this.showError(`Voices could not be listed: ${describe(error)}`);
    }
    const voices = this.voices;
    const menu = $("voice");
    menu.replaceChildren();
    const group = (label, items) => {
      if (!items.length) return;
      const node = document.createElement("optgroup");
      node.label = label;
      for (const [value, text, kind] of items) {
        const option = new Option(text, value);
        option.dataset.kind = kind;
        node.append(option);
      }
      menu.append(node);
    };
    if (!voices.builtin_known) menu.append(new Option("the model's default", ""));
    const builtin = voices.data.filter((v) => v.type === "builtin");
    const uploaded = voices.data.filter((v) => v.type !== "builtin");
    group("The model's voices", builtin.map((v) => [v.name, v.name, "builtin"]));
    group("Uploaded voices", uploaded.map((v) => [v.name, v.name, "uploaded"]));
    group(
      "Aliases",
      Object.entries(voices.aliases || {}).map(([alias, to]) => [alias, `${alias} → ${to}`, "alias"]),
    );
    if (!voices.builtin_known) {
      // The server cannot list the model's voices (a model not read yet): let people type one.
      menu.append(new Option("another name…", "\u0000other"));
    }
    if (select) menu.value = select;
    this.voiceChanged();
  }

  voiceChanged() {
    const menu = $("voice");
    const other = menu.value === "\u0000other";
    $("voice-name").hidden = !other;
    const option = menu.selectedOptions[0];
    $("voice-delete").hidden = !(option && option.dataset.kind === "uploaded");
  }

  voice() {
    const menu = $("voice");
    const name = menu.value === "\u0000other" ? $("voice-name").value.trim() : menu.value;
    return name || undefined;
  }

  // -- one request ----------------------------------------------------------------------------

  body() {
    const body = {
      input: $("speech-text").value,
      response_format: $("format").value,
      stream: true,
    };
    const voice = this.voice();
    if (voice) body.voice = voice;
    const speed = number("speed");
    if (speed !== undefined && speed !== 1) body.speed = speed;
    const rate = $("sample-rate").value;
    if (rate) body.sample_rate = Number(rate);
    for (const [key, id, integer] of [
      ["temperature", "temperature", false],
      ["top_p", "top-p", false],
      ["top_k", "top-k", true],
      ["seed", "seed", true],
    ]) {
      const value = number(id, integer);
      if (value !== undefined) body[key] = value;
    }
    const extra = $("speech-extra").value.trim();
    if (extra) {
      let fields;
      try {
        fields = JSON.parse(extra);
      } catch (error) {
        throw new Error(`More request fields: not JSON (${error.message})`);
      }
      if (!fields || typeof fields !== "object" || Array.isArray(fields)) {
        throw new Error("More request fields: write a JSON object, such as {\"language\": \"English\"}");
      }
      Object.assign(body, fields);
    }
    return body;
  }

  status(text, state, data = {}) {
    const node = $("speech-status");
    node.textContent = text;
    node.dataset.state = state;
    Object.assign(node.dataset, data);
  }

  showError(message) {
    const node = $("speech-error");
    node.textContent = message;
    node.hidden = !message;
  }

  async speak() {
    this.player.unlock(); // inside the click: browsers start audio only after a gesture
    this.stop();
    this.showError("");
    let body;
    try {
      body = this.body();
    } catch (error) {
      this.showError(error.message);
      return;
    }
    const format = body.response_format;
    const live = LIVE.has(format);
    const controller = new AbortController();
    this.controller = controller;
    for (const id of ["ttfa", "rtf", "audio-seconds"]) $(id).textContent = "–";
    $("speech-download").hidden = true;
    $("speech-audio").hidden = true;
    const status = $("speech-status");
    const keys = ["firstAudioMs", "playingMs", "doneMs", "audioState", "audioSeconds", "rtf"];
    for (const key of [...keys, "heardBeforeDone"]) {
      delete status.dataset[key];
    }
    this.status("Requesting…", "requesting");
    $("speak").disabled = true;
    $("speech-stop").disabled = false;
    const started = performance.now();
    let rate = body.sample_rate || this.deployment.sample_rate || 24000;
    this.player.reset(rate);
    const parts = [];
    let head = new Uint8Array(0);
    let header = null;
    let first = null;
    let playing = null;
    try {
      const response = await this.api.fetch("v1/audio/speech", {
        method: "POST",
        json: body,
        signal: controller.signal,
      });
      const reader = response.body.getReader();
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        if (!value.length) continue;
        parts.push(value);
        if (first === null) {
          first = performance.now() - started;
          $("ttfa").textContent = ms(first);
          this.status(live ? "Playing while it streams…" : `Receiving ${format}…`, "streaming", {
            firstAudioMs: String(Math.round(first)),
          });
        }
        if (!live) continue;
        let pcm = value;
        if (format === "wav" && !header) {
          head = concat([head, value]);
          header = parseWavHeader(head);
          if (!header) continue;
          rate = header.rate;
          this.player.rate = rate;
          pcm = head.subarray(header.dataOffset);
        }
        const wait = this.player.push(pcm);
        if (wait !== null && playing === null) {
          playing = performance.now() - started + wait * 1000;
          status.dataset.playingMs = String(Math.round(playing));
          status.dataset.audioState = this.player.state;
        }
      }
    } catch (error) {
      if (this.controller === controller) this.controller = null;
      $("speak").disabled = false;
      $("speech-stop").disabled = true;
      if (error.name === "AbortError") return;
      this.player.stop();
      this.status("Failed.", "error");
      this.showError(describe(error));
      return;
    }
    const elapsed = performance.now() - started;
    if (live && this.player.firstStart !== null) {
      // Whether the AudioContext's clock had passed the first sample when the last byte came.
      status.dataset.heardBeforeDone = String(this.player.context.currentTime > this.player.firstStart);
    }
    this.controller = null;
    $("speak").disabled = false;
    $("speech-stop").disabled = !this.player.playing;
    const bytes = concat(parts);
    const file = this.fileOf(bytes, format);
    const seconds = live ? this.player.seconds : await this.duration(file);
    $("audio-seconds").textContent = seconds ? `${seconds.toFixed(2)} s` : "–";
    if (seconds) {
      const factor = elapsed / 1000 / seconds;
      const speed = factor > 0 ? ` (${(1 / factor).toFixed(1)}× real time)` : "";
      $("rtf").textContent = `${factor.toFixed(2)}${speed}`;
      status.dataset.rtf = factor.toFixed(3);
      status.dataset.audioSeconds = seconds.toFixed(3);
    }
    status.dataset.doneMs = String(Math.round(elapsed));
    this.status(`Done in ${ms(elapsed)}.`, "done");
    this.offer(file, format, body.voice, !live);
  }

  /** What the download holds: the server's bytes (a streamed WAV's sizes made exact). */
  fileOf(bytes, format) {
    if (format === "wav") return fixWavSizes(bytes);
    return bytes;
  }

  async duration(file) {
    try {
      const context = this.player.unlock();
      const audio = await context.decodeAudioData(file.slice().buffer);
      return audio.duration;
    } catch {
      return null; // a format this browser cannot decode: no figure rather than a wrong one
    }
  }

  offer(file, format, voice, play) {
    for (const url of this.urls) URL.revokeObjectURL(url);
    const stamp = new Date().toISOString().replace(/[:.]/g, "-").slice(0, 19);
    const name = `omni-${voice || "speech"}-${stamp}.${EXTENSION[format]}`;
    const download = URL.createObjectURL(new Blob([file], { type: MEDIA[format] }));
    const link = $("speech-download");
    link.href = download;
    link.download = name;
    link.textContent = `Download ${format}`;
    link.hidden = false;
    const playable = format === "pcm" ? concat([wavHeader(this.player.rate, file.length), file]) : file;
    const listen = URL.createObjectURL(new Blob([playable], { type: MEDIA[format] }));
    this.urls = [download, listen];
    const audio = $("speech-audio");
    audio.src = listen;
    audio.hidden = false;
    if (play) audio.play().catch(() => {});
  }

  stop(message = null) {
    if (this.controller) this.controller.abort();
    this.controller = null;
    this.player.stop();
    $("speak").disabled = false;
    $("speech-stop").disabled = true;
    if (message) this.status(message, "idle");
  }

  // -- cloning ----------------------------------------------------------------------------------

  initClone() {
    const voices = this.voices;
    $("clone").hidden = !voices.cloning;
    if (!voices.cloning) return;
    $("clone-off").hidden = voices.uploads;
    $("clone-form").hidden = !voices.uploads;
    if (!voices.uploads) return;
    const problem = microphoneProblem();
    const button = $("clone-record");
    if (problem) {
      button.disabled = true;
      button.title = problem;
    }
    button.addEventListener("click", () => this.toggleRecording());
    $("clone-file").addEventListener("change", () => {
      const file = $("clone-file").files[0];
      this.clip = file ? { blob: file, name: file.name } : null;
      $("clone-clip").textContent = file ? `Clip: ${file.name} (${Math.round(file.size / 1024)} KiB)` : "No clip yet.";
    });
    $("clone-form").addEventListener("submit", (event) => {
      event.preventDefault();
      this.saveVoice();
    });
    $("voice-delete").addEventListener("click", () => this.deleteVoice());
  }

  async toggleRecording() {
    const button = $("clone-record");
    if (this.recording) {
      const recording = this.recording;
      this.recording = null;
      button.textContent = "Record";
      button.setAttribute("aria-pressed", "false");
      try {
        const { wav, seconds } = await recording.stop(24000);
        this.clip = { blob: new Blob([wav], { type: "audio/wav" }), name: "recording.wav" };
        $("clone-clip").textContent = `Recorded ${seconds.toFixed(1)} s.`;
      } catch (error) {
        $("clone-clip").textContent = `The recording could not be read: ${describe(error)}`;
      }
      return;
    }
    try {
      this.recording = await record();
    } catch (error) {
      $("clone-clip").textContent = `The microphone is not available: ${describe(error)}`;
      return;
    }
    button.textContent = "Stop recording";
    button.setAttribute("aria-pressed", "true");
    $("clone-clip").textContent = "Recording… speak for 3 to 10 seconds.";
  }

  async saveVoice() {
    const status = $("clone-status");
    const name = $("clone-name").value.trim();
    if (!this.clip) {
      status.textContent = "Record or upload a clip first.";
      return;
    }
    if (!$("clone-consent").checked) {
      status.textContent = "Cloning a voice needs the speaker's consent: tick the box.";
      return;
    }
    const form = new FormData();
    form.append("name", name);
    form.append("file", this.clip.blob, this.clip.name);
    form.append("transcript", $("clone-transcript").value.trim());
    form.append("consent", "true");
    status.textContent = "Computing the voice…";
    $("clone-save").disabled = true;
    try {
      const voice = await this.api.json("v1/audio/voices", { method: "POST", body: form });
      await this.loadVoices(voice.name);
      status.textContent = `Saved voice ${voice.name}.`;
    } catch (error) {
      status.textContent = `Not saved: ${describe(error)}`;
    } finally {
      $("clone-save").disabled = false;
    }
  }

  async deleteVoice() {
    const name = $("voice").value;
    const status = $("clone-status");
    try {
      await this.api.json(`v1/audio/voices/${encodeURIComponent(name)}`, { method: "DELETE" });
      await this.loadVoices();
      status.textContent = `Deleted voice ${name}.`;
    } catch (error) {
      status.textContent = `Not deleted: ${describe(error)}`;
    }
  }
}
