// The microphone, as a WAV file: MediaRecorder records in the browser's own format (WebM or
// Ogg Opus, which the server may not decode), so the recording is decoded here and written
// again as 16-bit mono WAV, which every endpoint that takes audio accepts. Or, for talking
// live (/v1/realtime), as a stream of PCM16 chunks at 24 kHz while the person speaks.

import { floatToWav } from "./wav.js";

export function microphoneProblem() {
  if (!window.isSecureContext) return "The microphone needs https or localhost.";
  if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
    return "This browser gives no access to a microphone.";
  }
  if (typeof MediaRecorder === "undefined") return "This browser cannot record audio.";
  return null;
}

/** Start recording; `await recording.stop(rate)` gives WAV bytes at `rate` and their duration. */
export async function record() {
  const stream = await navigator.mediaDevices.getUserMedia({ audio: true });
  const recorder = new MediaRecorder(stream);
  const parts = [];
  recorder.ondataavailable = (event) => {
    if (event.data.size) parts.push(event.data);
  };
  const stopped = new Promise((resolve) => {
    recorder.onstop = resolve;
  });
  recorder.start();
  const started = performance.now();
  return {
    started,
    async stop(rate) {
      recorder.stop();
      await stopped;
      stream.getTracks().forEach((track) => track.stop());
      const blob = new Blob(parts, { type: recorder.mimeType });
      return toWav(await blob.arrayBuffer(), rate);
    },
  };
}

/** Any audio file the browser can decode, as mono 16-bit WAV bytes at `rate` Hz. */
export async function toWav(encoded, rate = 24000) {
  const context = new OfflineAudioContext(1, 1, rate);
  const audio = await context.decodeAudioData(encoded);
  const mono = new Float32Array(audio.length);
  for (let c = 0; c < audio.numberOfChannels; c++) {
    const channel = audio.getChannelData(c);
    for (let i = 0; i < audio.length; i++) mono[i] += channel[i] / audio.numberOfChannels;
  }
  return { wav: floatToWav(mono, audio.sampleRate), seconds: audio.duration };
}

/** Whether the microphone can be streamed live (`listen`); null when it can. */
export function streamingProblem() {
  if (!window.isSecureContext) return "The microphone needs https or localhost.";
  if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
    return "This browser gives no access to a microphone.";
  }
  if (typeof AudioContext === "undefined") return "This browser has no Web Audio.";
  return null;
}

/**
 * Mono float samples at the device's rate to PCM16 at `rate`, piece by piece: each output
 * sample is the mean of the input samples its period covers (a box filter, enough against
 * aliasing for speech going down to 24 kHz), with the fractional position kept across pieces.
 */
export class Downsampler {
  constructor(from, to) {
    this.step = from / to; // input samples per output sample (>= 1 when going down)
    this.position = 0; // where the next output period starts, in input samples of this piece
    this.sum = 0; // a period left open at the end of the last piece
    this.count = 0;
    this.previous = 0; // the last sample of the last piece (going up)
  }

  /** A device slower than `to` (rare): linear interpolation, the position kept across pieces. */
  up(samples) {
    const out = [];
    let t = this.position; // of the next output sample; -1 is the last piece's last sample
    while (t < samples.length - 1) {
      const i = Math.floor(t);
      const a = i < 0 ? this.previous : samples[i];
      out.push(a + (samples[i + 1] - a) * (t - i));
      t += this.step;
    }
    if (samples.length) this.previous = samples[samples.length - 1];
    this.position = t - samples.length;
    return out;
  }

  /** PCM16 little-endian bytes for the whole periods `samples` completes. */
  push(samples) {
    if (this.step === 1) return floatsToPcm16(samples);
    if (this.step < 1) return floatsToPcm16(this.up(samples));
    const out = [];
    let { sum, count } = this;
    let end = this.position + this.step;
    for (let i = 0; i < samples.length; i++) {
      sum += samples[i];
      count += 1;
      if (i + 1 >= end) {
        out.push(sum / count);
        sum = 0;
        count = 0;
        end += this.step;
      }
    }
    this.sum = sum;
    this.count = count;
    this.position = end - this.step - samples.length;
    return floatsToPcm16(out);
  }
}

function floatsToPcm16(samples) {
  const view = new DataView(new ArrayBuffer(samples.length * 2));
  for (let i = 0; i < samples.length; i++) {
    const s = Math.max(-1, Math.min(1, samples[i]));
    view.setInt16(i * 2, Math.round(s * 32767), true);
  }
  return new Uint8Array(view.buffer);
}

/**
 * Stream the microphone: `onChunk(bytes)` gets PCM16 mono at `rate` Hz, `chunkMs` milliseconds
 * of it each time. Resolves once the microphone is on (rejects when it is refused);
 * `await stream.stop()` turns it off. The capture runs on a ScriptProcessorNode, which every
 * browser has and which needs no worklet file (a module the page would load separately).
 */
export async function listen(onChunk, { rate = 24000, chunkMs = 100 } = {}) {
  const media = await navigator.mediaDevices.getUserMedia({
    audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true, autoGainControl: true },
  });
  let context;
  try {
    context = new AudioContext();
    if (context.state === "suspended") await context.resume();
  } catch (error) {
    media.getTracks().forEach((track) => track.stop());
    throw error;
  }
  const source = context.createMediaStreamSource(media);
  const processor = context.createScriptProcessor(2048, 1, 1);
  const down = new Downsampler(context.sampleRate, rate);
  const chunkBytes = Math.round((rate * chunkMs) / 1000) * 2;
  let pending = new Uint8Array(0); // less than a chunk, kept for the next one
  processor.onaudioprocess = (event) => {
    const pcm = down.push(event.inputBuffer.getChannelData(0));
    if (!pcm.length) return;
    const all = new Uint8Array(pending.length + pcm.length);
    all.set(pending);
    all.set(pcm, pending.length);
    let offset = 0;
    for (; offset + chunkBytes <= all.length; offset += chunkBytes) {
      onChunk(all.slice(offset, offset + chunkBytes));
    }
    pending = all.slice(offset);
  };
  source.connect(processor);
  processor.connect(context.destination); // it runs only when connected; its output is silence
  return {
    rate,
    deviceRate: context.sampleRate,
    track: media.getAudioTracks()[0],
    async stop() {
      processor.onaudioprocess = null;
      source.disconnect();
      processor.disconnect();
      media.getTracks().forEach((track) => track.stop());
      await context.close();
    },
  };
}
