// 16-bit PCM and WAV, by hand: the server streams raw PCM (or a WAV whose size fields say
// "unknown"), the microphone gives whatever the browser records, and the voices API wants
// a file it can decode. Mono throughout.

/** A 44-byte PCM16 WAV header for `dataBytes` of audio at `rate`. */
export function wavHeader(rate, dataBytes) {
  const header = new DataView(new ArrayBuffer(44));
  const text = (offset, s) => [...s].forEach((c, i) => header.setUint8(offset + i, c.charCodeAt(0)));
  text(0, "RIFF");
  header.setUint32(4, 36 + dataBytes, true);
  text(8, "WAVE");
  text(12, "fmt ");
  header.setUint32(16, 16, true);
  header.setUint16(20, 1, true); // PCM
  header.setUint16(22, 1, true); // mono
  header.setUint32(24, rate, true);
  header.setUint32(28, rate * 2, true);
  header.setUint16(32, 2, true);
  header.setUint16(34, 16, true);
  text(36, "data");
  header.setUint32(40, dataBytes, true);
  return new Uint8Array(header.buffer);
}

/** The sample rate and where the samples start, from the first bytes of a WAV; null if short. */
export function parseWavHeader(bytes) {
  if (bytes.length < 12) return null;
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const tag = (offset) => String.fromCharCode(...bytes.subarray(offset, offset + 4));
  if (tag(0) !== "RIFF" || tag(8) !== "WAVE") throw new Error("the stream is not a WAV file");
  let offset = 12;
  let rate = null;
  while (offset + 8 <= bytes.length) {
    const id = tag(offset);
    const size = view.getUint32(offset + 4, true);
    if (id === "fmt " && offset + 16 <= bytes.length) rate = view.getUint32(offset + 12, true);
    if (id === "data") return rate ? { rate, dataOffset: offset + 8 } : null;
    offset += 8 + size + (size % 2);
  }
  return null;
}

/** The whole streamed WAV with its size fields made exact (a stream wrote "unknown"). */
export function fixWavSizes(bytes) {
  const info = parseWavHeader(bytes);
  if (!info) return bytes;
  const out = new Uint8Array(bytes);
  const view = new DataView(out.buffer);
  view.setUint32(4, out.length - 8, true);
  view.setUint32(info.dataOffset - 4, out.length - info.dataOffset, true);
  return out;
}

/** PCM16 little-endian bytes to float samples in [-1, 1]. */
export function pcmToFloat(bytes) {
  const samples = new Float32Array(bytes.length >> 1);
  const view = new DataView(bytes.buffer, bytes.byteOffset, samples.length * 2);
  for (let i = 0; i < samples.length; i++) samples[i] = view.getInt16(i * 2, true) / 32768;
  return samples;
}

/** Float samples to a PCM16 WAV file. */
export function floatToWav(samples, rate) {
  const data = new DataView(new ArrayBuffer(samples.length * 2));
  for (let i = 0; i < samples.length; i++) {
    const s = Math.max(-1, Math.min(1, samples[i]));
    data.setInt16(i * 2, Math.round(s * 32767), true);
  }
  return concat([wavHeader(rate, data.byteLength), new Uint8Array(data.buffer)]);
}

export function concat(parts) {
  const total = parts.reduce((n, p) => n + p.length, 0);
  const out = new Uint8Array(total);
  let offset = 0;
  for (const part of parts) {
    out.set(part, offset);
    offset += part.length;
  }
  return out;
}

export function base64(bytes) {
  let text = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    text += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  }
  return btoa(text);
}

export function fromBase64(text) {
  const raw = atob(text);
  const out = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
  return out;
}
