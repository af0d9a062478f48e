// The microphone, as a WAV file: MediaRecorder records in the browser's own format (WebM or
// Ogg Opus, which the server may not decode), so the recording is decoded here and written
// again as 16-bit mono WAV, which every endpoint that takes audio accepts.

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
