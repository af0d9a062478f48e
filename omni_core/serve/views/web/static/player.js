// Plays 16-bit PCM as it arrives: each piece becomes an AudioBuffer scheduled right after
// the previous one on one AudioContext, so speech is heard while the server still makes it.
// A piece that arrives late starts a little ahead of "now" (an audible gap, never overlap).

import { pcmToFloat } from "./wav.js";

const LEAD = 0.06; // seconds between scheduling a piece and hearing it, when the queue ran dry

/** Dispatches "idle" when the last queued piece has played. */
export class PcmPlayer extends EventTarget {
  constructor() {
    super();
    this.context = null;
    this.sources = new Set();
    this.reset(24000);
  }

  /** Call from a click or key handler: browsers let audio start only after a user gesture. */
  unlock() {
    if (!this.context) this.context = new AudioContext();
    if (this.context.state === "suspended") this.context.resume();
    return this.context;
  }

  /** A new stream of `rate` Hz: forget what the last one left. */
  reset(rate) {
    this.rate = rate;
    this.next = 0;
    this.carry = null; // an odd byte: half a sample, completed by the next piece
    this.samples = 0;
    this.firstStart = null; // AudioContext time of the first sample
    this.underruns = 0;
    this.pieces = []; // [AudioContext time it starts, seconds] of each piece of this stream
  }

  get state() {
    return this.context ? this.context.state : "none";
  }

  get playing() {
    return this.sources.size > 0;
  }

  /** Queue PCM16 bytes; returns the seconds until the first sample of this piece plays. */
  push(bytes) {
    let data = bytes;
    if (this.carry) {
      data = new Uint8Array(bytes.length + 1);
      data[0] = this.carry;
      data.set(bytes, 1);
      this.carry = null;
    }
    if (data.length % 2) {
      this.carry = data[data.length - 1];
      data = data.subarray(0, data.length - 1);
    }
    if (!data.length) return null;
    const context = this.unlock();
    const samples = pcmToFloat(data);
    const buffer = context.createBuffer(1, samples.length, this.rate);
    buffer.copyToChannel(samples, 0);
    const source = context.createBufferSource();
    source.buffer = buffer;
    source.connect(context.destination);
    const now = context.currentTime;
    if (this.next && this.next < now) this.underruns += 1;
    const at = Math.max(this.next, now + LEAD);
    source.start(at);
    this.sources.add(source);
    source.onended = () => {
      this.sources.delete(source);
      if (!this.sources.size) this.dispatchEvent(new Event("idle"));
    };
    this.next = at + buffer.duration;
    this.pieces.push([at, buffer.duration]);
    this.samples += samples.length;
    if (this.firstStart === null) this.firstStart = at;
    return at - now;
  }

  /** Seconds of audio queued so far. */
  get seconds() {
    return this.samples / this.rate;
  }

  /** Seconds of this stream heard so far, by the AudioContext's clock (gaps not counted). */
  played() {
    if (!this.context) return 0;
    const now = this.context.currentTime;
    let heard = 0;
    for (const [at, seconds] of this.pieces) heard += Math.min(seconds, Math.max(0, now - at));
    return heard;
  }

  stop() {
    for (const source of this.sources) {
      try {
        source.stop();
      } catch {
        // already ended
      }
    }
    this.sources.clear();
    this.next = 0;
    if (this.context) {
      // what was cut off was never heard: played() stays what it was at this moment
      const now = this.context.currentTime;
      this.pieces = this.pieces.map(([at, seconds]) => [at, Math.min(seconds, Math.max(0, now - at))]);
    }
  }
}
