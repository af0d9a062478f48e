// The talk panel: a spoken conversation over the Realtime API (WebSocket /v1/realtime).
//
// The microphone streams as PCM16 at 24 kHz in ~100 ms input_audio_buffer.append events; the
// server finds where each turn starts and ends (server VAD) and answers by itself, so the
// person just talks. The answer's audio (response.output_audio.delta) plays gaplessly as it
// arrives (player.js). Speaking over it (input_audio_buffer.speech_started) stops playback at
// once; the server cancels the response itself, and the page tells it how much was heard
// (conversation.item.truncate) so the conversation holds only that. Both sides are shown as
// text: the answer's transcript as it streams, the user's once the server transcribed it.
// Per turn the page shows the latency a person feels: from the server saying the user
// stopped (input_audio_buffer.speech_stopped) to the first audio of the answer.

import { PcmPlayer } from "./player.js";
import { listen, streamingProblem } from "./recorder.js";
import { base64, fromBase64 } from "./wav.js";

const $ = (id) => document.getElementById(id);
const RATE = 24000; // the Realtime API's PCM: 24 kHz, 16-bit, mono
const SUBPROTOCOL = "realtime";

/** ws(s)://this-host/…/v1/realtime, relative to the page as the other calls are. */
function socketUrl() {
  const url = new URL("v1/realtime", document.baseURI);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  return url.href;
}

function closeReason(event) {
  const reason = event.reason ? `: ${event.reason}` : "";
  return `code ${event.code}${reason}`;
}

export class TalkPanel {
  constructor(api, deployment, voices) {
    this.api = api;
    this.deployment = deployment;
    this.voices = voices; // the speech panel's listing, when the pipeline serves speech
    this.player = new PcmPlayer(); // its own: the other panels' Stop must not cut a conversation
    this.socket = null;
    this.microphone = null;
    this.entries = new Map(); // item id -> its <li>
    this.playing = null; // { responseId, itemId, receivedMs } whose audio the player holds
    this.active = null; // the response in progress (between response.created and .done)
    this.interrupted = new Set(); // responses cut off: their late deltas are dropped
    this.pendingTruncate = null; // { responseId, itemId, audioEndMs } sent once it is done
    this.stoppedAt = null; // performance.now() of the last speech_stopped
    this.counters = { audioDeltas: 0, audioMs: 0, heardMs: 0, userTurns: 0, answers: 0, bargeIns: 0 };
  }

  init() {
    $("talk-panel").hidden = false;
    const problem = streamingProblem();
    if (problem) {
      $("talk-toggle").disabled = true;
      $("talk-toggle").title = problem;
      this.status(problem, "unavailable");
    }
    if (!this.deployment.outputs.audio) {
      $("talk-note").textContent = "This pipeline answers in text: the answer is shown, not spoken.";
    }
    const names = this.voices && this.deployment.outputs.audio ? this.voices.data.map((v) => v.name) : [];
    if (names.length) {
      $("talk-voice-field").hidden = false;
      $("talk-voice").replaceChildren(new Option("the model's default", ""), ...names.map((n) => new Option(n, n)));
    }
    $("talk-toggle").addEventListener("click", () => (this.socket ? this.stop() : this.start()));
    $("talk-clear").addEventListener("click", () => {
      $("talk-log").replaceChildren();
      this.entries.clear();
    });
    this.player.addEventListener("idle", () => this.heard());
    this.show();
  }

  // -- what the page shows -------------------------------------------------------------------

  status(text, state) {
    const node = $("talk-status");
    node.textContent = text;
    node.dataset.state = state;
  }

  showError(message) {
    $("talk-error").textContent = message;
    $("talk-error").hidden = !message;
  }

  /** The counters, on the status line's data attributes (for people with devtools, and tests). */
  show() {
    const node = $("talk-status");
    for (const [key, value] of Object.entries(this.counters)) node.dataset[key] = String(Math.round(value));
    node.dataset.audioContext = this.player.state;
  }

  entry(itemId, role) {
    let li = this.entries.get(itemId);
    if (li) return li;
    li = document.createElement("li");
    li.dataset.role = role;
    li.dataset.item = itemId;
    const who = document.createElement("span");
    who.className = "who";
    who.textContent = role === "user" ? "You" : this.deployment.model;
    const body = document.createElement("span");
    body.className = "text";
    li.append(who, body);
    $("talk-log").append(li);
    this.entries.set(itemId, li);
    li.scrollIntoView({ block: "nearest" });
    return li;
  }

  note(li, text) {
    let node = li.querySelector(".note");
    if (!node) {
      node = document.createElement("span");
      node.className = "note";
      li.append(node);
    }
    node.textContent = text;
  }

  // -- the session ---------------------------------------------------------------------------

  async start() {
    this.player.unlock(); // inside the click: browsers start audio only after a gesture
    this.showError("");
    const button = $("talk-toggle");
    button.disabled = true;
    this.status("Connecting…", "connecting");
    const protocols = [SUBPROTOCOL];
    if (this.api.key) protocols.push(`bearer.${this.api.key}`); // never in the URL
    let socket;
    try {
      socket = new WebSocket(socketUrl(), protocols);
    } catch (error) {
      this.fail(`The connection could not be opened: ${error.message}`);
      return;
    }
    this.socket = socket;
    let opened = false;
    socket.addEventListener("message", (event) => this.receive(event.data));
    socket.addEventListener("close", (event) => {
      if (this.socket !== socket) return; // closed by stop()
      this.socket = null;
      this.release();
      if (opened) {
        this.fail(`The connection closed (${closeReason(event)}).`);
      } else {
        const key = this.api.key ? "the API key was refused, or " : "";
        this.fail(`The server did not take the connection (${closeReason(event)}): ${key}the server is not reachable.`);
      }
    });
    await new Promise((resolve) => {
      socket.addEventListener("open", resolve, { once: true });
      socket.addEventListener("close", resolve, { once: true });
    });
    if (this.socket !== socket || socket.readyState !== WebSocket.OPEN) return;
    opened = true;
    this.send({ type: "session.update", session: this.session() });
    try {
      this.microphone = await listen((pcm) => this.append(pcm), { rate: RATE, chunkMs: 100 });
    } catch (error) {
      const name = error && error.name;
      const why =
        name === "NotAllowedError" || name === "SecurityError"
          ? "permission was denied (allow the microphone for this page and try again)"
          : name === "NotFoundError"
            ? "no microphone was found"
            : (error && error.message) || String(error);
      this.stop();
      this.fail(`The microphone is not available: ${why}.`);
      return;
    }
    if (this.socket !== socket) {
      // stopped (or closed) while the browser was asking for the microphone
      await this.microphone.stop();
      this.microphone = null;
      return;
    }
    button.disabled = false;
    button.textContent = "Stop talking";
    button.setAttribute("aria-pressed", "true");
    this.status("Listening: just talk.", "listening");
  }

  /** session.update: PCM both ways, server VAD, transcripts of what the user says. */
  session() {
    const pcm = { type: "audio/pcm", rate: RATE };
    const session = {
      type: "realtime",
      audio: {
        input: { format: pcm, turn_detection: { type: "server_vad" }, transcription: { model: this.deployment.model } },
      },
    };
    if (this.deployment.outputs.audio) session.audio.output = { format: pcm };
    const voice = $("talk-voice-field").hidden ? "" : $("talk-voice").value;
    if (voice) (session.audio.output ||= {}).voice = voice;
    const max = Number.parseInt($("talk-max-tokens").value, 10);
    if (Number.isFinite(max) && max > 0) session.max_output_tokens = max;
    const temperature = $("talk-temperature").value;
    if (temperature !== "") session.temperature = Number(temperature);  // 0: greedy
    const instructions = $("talk-instructions").value.trim();
    if (instructions) session.instructions = instructions;
    return session;
  }

  send(payload) {
    if (this.socket && this.socket.readyState === WebSocket.OPEN) this.socket.send(JSON.stringify(payload));
  }

  append(pcm) {
    this.send({ type: "input_audio_buffer.append", audio: base64(pcm) });
  }

  /** Stop talking: the microphone off, the socket closed by us (1000), what plays stopped. */
  stop() {
    const socket = this.socket;
    this.socket = null;
    if (socket && socket.readyState <= WebSocket.OPEN) socket.close(1000, "the user stopped talking");
    this.release();
    this.status("Stopped.", "idle");
  }

  release() {
    if (this.microphone) {
      this.microphone.stop().catch(() => {});
      this.microphone = null;
    }
    this.heard();
    this.player.stop();
    this.playing = null;
    this.active = null;
    this.pendingTruncate = null;
    const button = $("talk-toggle");
    button.disabled = Boolean(streamingProblem());
    button.textContent = "Start talking";
    button.setAttribute("aria-pressed", "false");
    this.show();
  }

  fail(message) {
    this.showError(message);
    this.status("Not connected.", "error");
  }

  // -- server events -------------------------------------------------------------------------

  receive(data) {
    let event;
    try {
      event = JSON.parse(data);
    } catch {
      return; // the protocol is JSON text; anything else is not ours to show
    }
    const handler = this.handlers[event.type];
    if (handler) handler.call(this, event);
  }

  /** The audio the player holds was heard up to now: count it (once per stream). */
  heard() {
    if (!this.playing) return;
    this.counters.heardMs += this.player.played() * 1000 - this.playing.countedMs;
    this.playing.countedMs = this.player.played() * 1000;
    this.show();
  }

  bargeIn() {
    const playing = this.playing;
    if (!playing || !this.player.playing) return;
    this.heard();
    const heardMs = this.player.played() * 1000;
    this.player.stop(); // at once: the person is speaking
    this.interrupted.add(playing.responseId);
    this.counters.bargeIns += 1;
    const truncate = {
      responseId: playing.responseId,
      itemId: playing.itemId,
      audioEndMs: Math.max(0, Math.floor(Math.min(heardMs, playing.receivedMs))),
    };
    const li = this.entries.get(playing.itemId);
    if (li) this.note(li, `interrupted after ${(truncate.audioEndMs / 1000).toFixed(1)} s`);
    this.playing = null;
    // The server adds the answer to the conversation when the response ends: truncate it then.
    if (this.active === playing.responseId) this.pendingTruncate = truncate;
    else this.truncate(truncate);
    this.show();
  }

  truncate({ itemId, audioEndMs }) {
    this.send({ type: "conversation.item.truncate", item_id: itemId, content_index: 0, audio_end_ms: audioEndMs });
  }

  answerText(event) {
    if (this.interrupted.has(event.response_id)) return;
    const li = this.entry(event.item_id, "assistant");
    li.querySelector(".text").textContent += event.delta;
    if (!this.deployment.outputs.audio) this.firstOutput(event, li);
  }

  /** The first output of a response after the user stopped: the turn latency. */
  firstOutput(event, li) {
    if (this.stoppedAt === null) return;
    const ms = Math.round(performance.now() - this.stoppedAt);
    this.stoppedAt = null;
    $("talk-latency").textContent = `${ms} ms`;
    $("talk-status").dataset.latencyMs = String(ms);
    li.dataset.latencyMs = String(ms);
    const what = this.deployment.outputs.audio ? "first audio" : "first text";
    this.note(li, `${what} ${ms} ms after you stopped`);
  }

  handlers = {
    "session.updated"() {
      $("talk-status").dataset.session = "updated";
    },
    "input_audio_buffer.speech_started"() {
      this.stoppedAt = null;
      if (this.active) this.interrupted.add(this.active); // the server cancels it (barge-in)
      this.bargeIn();
      this.status("Hearing you…", "user-speaking");
    },
    "input_audio_buffer.speech_stopped"() {
      this.stoppedAt = performance.now();
      this.status("Thinking…", "waiting");
    },
    "input_audio_buffer.committed"(event) {
      this.counters.userTurns += 1;
      const li = this.entry(event.item_id, "user");
      li.querySelector(".text").textContent = "…";
      li.dataset.transcript = "pending";
      this.show();
    },
    "conversation.item.input_audio_transcription.completed"(event) {
      const li = this.entry(event.item_id, "user");
      li.querySelector(".text").textContent = event.transcript || "(nothing heard)";
      li.dataset.transcript = "done";
    },
    "conversation.item.input_audio_transcription.failed"(event) {
      const li = this.entry(event.item_id, "user");
      const message = (event.error && event.error.message) || "unknown error";
      li.querySelector(".text").textContent = `(not transcribed: ${message})`;
      li.dataset.transcript = "failed";
    },
    "response.created"(event) {
      this.active = event.response.id;
    },
    "response.output_audio_transcript.delta": TalkPanel.prototype.answerText,
    "response.output_text.delta": TalkPanel.prototype.answerText,
    "response.output_audio.delta"(event) {
      if (this.interrupted.has(event.response_id)) return; // cut off: late pieces are not played
      const li = this.entry(event.item_id, "assistant");
      if (!this.playing || this.playing.responseId !== event.response_id) {
        this.heard();
        this.player.stop();
        this.player.reset(RATE);
        this.playing = { responseId: event.response_id, itemId: event.item_id, receivedMs: 0, countedMs: 0 };
        this.firstOutput(event, li);
      }
      const pcm = fromBase64(event.delta);
      this.player.push(pcm);
      this.playing.receivedMs += (pcm.length / 2 / RATE) * 1000;
      this.counters.audioDeltas += 1;
      this.counters.audioMs += (pcm.length / 2 / RATE) * 1000;
      if (this.socket) this.status("Answering… (talk to interrupt)", "answering");
      this.show();
    },
    "response.done"(event) {
      const response = event.response || {};
      if (this.active === response.id) this.active = null;
      if (response.status !== "cancelled") this.counters.answers += 1;
      const pending = this.pendingTruncate;
      if (pending && pending.responseId === response.id) {
        this.pendingTruncate = null;
        this.truncate(pending);
      }
      const li = (response.output || []).map((item) => this.entries.get(item.id)).find(Boolean);
      if (li && response.status === "failed") {
        const error = (response.status_details && response.status_details.error) || {};
        this.note(li, `failed: ${error.message || "unknown error"}`);
      }
      if (this.socket && $("talk-status").dataset.state !== "user-speaking") {
        this.status("Listening: just talk.", "listening");
      }
      this.show();
    },
    "conversation.item.truncated"(event) {
      const li = this.entries.get(event.item_id);
      if (li) li.dataset.truncatedMs = String(event.audio_end_ms);
    },
    error(event) {
      const error = event.error || {};
      const param = error.param ? ` (field: ${error.param})` : "";
      this.showError(`The server said: ${error.message || "an error"}${param}`);
    },
  };
}
