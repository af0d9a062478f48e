// The deployment, drawn and live: the server's own picture of its plan (GET
// /v1/deployment.svg, inlined so it can be painted on), with every process's state and
// restarts and every stage's running / waiting requests from GET /health, and requests in
// flight per process from GET /metrics, once a second. A table says the same in words, for
// screen readers and narrow screens. Neither squeezes its text: a picture wider than the
// screen scrolls sideways in its own box at a scale where its smallest text is still 11 px
// (a seven-process plan shrunk to a phone's 390 px drew 4 px text), and the table scrolls
// rather than break a word.

const $ = (id) => document.getElementById(id);
const PERIOD_MS = 1000;
const WIDE = 900; // px: a picture wider than this would be unreadable in half the page
const LEGIBLE = 11; // px: no text of the picture is drawn smaller, whatever the screen
const INFLIGHT = /^omni_process_inflight_requests\{([^}]*)\}\s+(\S+)$/gm;
const LABEL = /(\w+)="((?:[^"\\]|\\.)*)"/g;

/** In-flight requests per (logical process, replica), from Prometheus' text format. */
export function inflightOf(text) {
  const found = new Map();
  for (const match of text.matchAll(INFLIGHT)) {
    const labels = Object.fromEntries([...match[1].matchAll(LABEL)].map((m) => [m[1], m[2]]));
    found.set(`${labels.process}\u0000${labels.replica}`, Number(match[2]));
  }
  return found;
}

/** Write a live line of the picture, squeezed to its room when it is longer than usual. */
function writeLine(line, text) {
  line.removeAttribute("textLength");
  line.removeAttribute("lengthAdjust");
  line.textContent = text;
  const room = Number(line.dataset.maxWidth);
  if (room && text && line.getComputedTextLength() > room) {
    line.setAttribute("textLength", String(room));
    line.setAttribute("lengthAdjust", "spacingAndGlyphs");
  }
}

/** The smallest font size (in the picture's own units) of any text in an SVG document. */
function smallestFont(svg) {
  let smallest = Infinity;
  for (const text of svg.querySelectorAll("text, tspan")) {
    const size = Number.parseFloat(text.getAttribute("font-size"));
    if (size > 0) smallest = Math.min(smallest, size);
  }
  return Number.isFinite(smallest) ? smallest : 16; // 16: the browser's default size
}

function cssEscape(value) {
  return window.CSS && CSS.escape ? CSS.escape(value) : value.replace(/["\\]/g, "\\$&");
}

export class DeploymentView {
  constructor(api, deployment) {
    this.api = api;
    this.deployment = deployment;
    this.timer = null;
    this.busy = false;
    this.rows = new Map();
  }

  async init() {
    await this.drawPicture();
    this.buildTable();
    await this.refresh();
    this.timer = setInterval(() => this.refresh(), PERIOD_MS);
  }

  async drawPicture() {
    const holder = $("deployment-picture");
    try {
      const text = await this.api.text("v1/deployment.svg");
      const doc = new DOMParser().parseFromString(text, "image/svg+xml");
      const svg = doc.documentElement;
      if (svg.nodeName !== "svg") throw new Error("the picture is not an SVG document");
      // Fit the page's width, but never grow a small plan past its own size, and never shrink
      // one so far that its smallest text drops under LEGIBLE px: past that the box scrolls
      // sideways (a phone). The viewBox keeps proportions.
      const natural = Number.parseFloat(svg.getAttribute("width")) || 800;
      const least = LEGIBLE / smallestFont(svg);
      svg.removeAttribute("height");
      svg.setAttribute("width", "100%");
      const picture = document.importNode(svg, true);
      picture.style.minWidth = `${Math.ceil(natural * least)}px`;
      picture.style.maxWidth = `${Math.ceil(natural * Math.max(1, least))}px`;
      holder.replaceChildren(picture);
      // A wide plan gets the page's whole width even beside a single panel.
      $("deployment-panel").classList.toggle("span", natural > WIDE);
    } catch (error) {
      holder.textContent = `The picture could not be loaded: ${error.message}`;
    }
  }

  buildTable() {
    const body = document.querySelector("#process-table tbody");
    body.replaceChildren();
    for (const process of this.deployment.processes) {
      const row = document.createElement("tr");
      row.dataset.process = process.name;
      const cells = {};
      for (const key of ["name", "where", "state", "restarts", "inflight", "stages"]) {
        const cell = document.createElement(key === "name" ? "th" : "td");
        if (key === "name") cell.scope = "row";
        cells[key] = cell;
        row.append(cell);
      }
      cells.name.textContent = process.name;
      cells.where.textContent = process.gpu === null ? "CPU" : `GPU ${process.gpu}`;
      cells.state.textContent = "…";
      cells.stages.textContent = process.stages.join(", ");
      body.append(row);
      this.rows.set(process.name, cells);
    }
  }

  async refresh() {
    if (this.busy || document.hidden) return;
    this.busy = true;
    try {
      // /health answers 503 (with the same JSON) while a process is down: read it anyway.
      const response = await fetch("health", { cache: "no-store" });
      const health = await response.json();
      let inflight = null;
      try {
        inflight = inflightOf(await this.api.text("metrics"));
      } catch {
        inflight = null; // metrics behind a key we lack: the rest still shows
      }
      this.paint(health, inflight);
    } catch (error) {
      $("deployment-status").textContent = `The server did not answer /health: ${error.message}`;
      $("deployment-status").dataset.status = "unreachable";
    } finally {
      this.busy = false;
    }
  }

  processInflight(process, inflight) {
    if (!inflight || (process.tp_rank !== null && process.tp_rank > 0)) return null;
    const value = inflight.get(`${process.logical}\u0000${process.replica}`);
    return value === undefined ? null : value;
  }

  paint(health, inflight) {
    const status = $("deployment-status");
    status.textContent =
      `${health.status} · ${health.inflight} in flight (limit ${health.max_inflight})` +
      ` · updated ${new Date().toLocaleTimeString()}`;
    status.dataset.status = health.status;
    for (const process of this.deployment.processes) {
      const info = (health.processes || {})[process.name];
      if (!info) continue;
      const busy = this.processInflight(process, inflight);
      const restarts = `${info.restarts} restart${info.restarts === 1 ? "" : "s"}`;
      const words = [info.state, restarts];
      if (busy !== null) words.push(`${busy} in flight`);
      const box = document.querySelector(`.process[data-process="${cssEscape(process.name)}"]`);
      if (box) {
        box.dataset.state = info.state;
        const line = box.querySelector(".process-live");
        if (line) writeLine(line, words.join(" · "));
      }
      const queue = info.queue || {};
      const stages = [];
      for (const [stage, counts] of Object.entries(queue)) {
        const running = counts.running || 0;
        const waiting = counts.waiting || 0;
        stages.push(`${stage} ${running} / ${waiting}`);
        const node = document.querySelector(
          `.stage[data-process="${cssEscape(process.name)}"][data-stage="${cssEscape(stage)}"]`,
        );
        if (!node) continue;
        node.dataset.running = String(running);
        node.dataset.waiting = String(waiting);
        node.dataset.busy = String(running + waiting > 0);
        const line = node.querySelector(".stage-live");
        if (line) writeLine(line, `running ${running} · waiting ${waiting}`);
      }
      const cells = this.rows.get(process.name);
      if (cells) {
        cells.state.textContent = info.state;
        cells.state.dataset.state = info.state;
        cells.restarts.textContent = String(info.restarts);
        cells.inflight.textContent = busy === null ? "–" : String(busy);
        cells.stages.textContent = stages.join(", ") || process.stages.join(", ");
      }
    }
  }
}
