// The server's public API, as the page calls it: relative URLs (so a proxy may mount the
// server under a prefix), the API key from this tab's session storage as a Bearer header
// (never in a URL), and errors in the server's own words.

const KEY = "omni.apiKey";

export class ApiError extends Error {
  constructor(status, message, param = null) {
    super(message);
    this.status = status;
    this.param = param;
  }
}

/** The message of an error response: the server's JSON `error.message`, else its status. */
export async function errorOf(response) {
  let message = `${response.status} ${response.statusText}`.trim();
  let param = null;
  try {
    const body = await response.json();
    if (body && body.error && body.error.message) {
      message = body.error.message;
      param = body.error.param || null;
    }
  } catch {
    // not JSON: keep the status line
  }
  return new ApiError(response.status, message, param);
}

export class Api {
  /** `onUnauthorized(error, hadKey)` is told about every 401, so the page can ask for a key. */
  constructor(onUnauthorized) {
    this.onUnauthorized = onUnauthorized;
  }

  get key() {
    return sessionStorage.getItem(KEY) || "";
  }

  set key(value) {
    if (value) sessionStorage.setItem(KEY, value);
    else sessionStorage.removeItem(KEY);
  }

  /** fetch(path) with the key; a response that is not ok becomes an ApiError. */
  async fetch(path, { method = "GET", json, body, signal, headers = {} } = {}) {
    const sent = { ...headers };
    if (this.key) sent.Authorization = `Bearer ${this.key}`;
    if (json !== undefined) {
      sent["Content-Type"] = "application/json";
      body = JSON.stringify(json);
    }
    const response = await fetch(path, { method, headers: sent, body, signal, cache: "no-store" });
    if (response.ok) return response;
    const error = await errorOf(response);
    if (response.status === 401) this.onUnauthorized(error, Boolean(this.key));
    throw error;
  }

  async json(path, options) {
    return (await this.fetch(path, options)).json();
  }

  async text(path, options) {
    return (await this.fetch(path, options)).text();
  }
}

/** "Failed to fetch" and friends, said for people. */
export function describe(error) {
  if (error instanceof ApiError) {
    return error.param ? `${error.message} (field: ${error.param})` : error.message;
  }
  if (error && error.name === "AbortError") return "Stopped.";
  if (error instanceof TypeError) return `The server could not be reached (${error.message}).`;
  return String(error && error.message ? error.message : error);
}
