// The playground's entry point: ask the server what it deploys (GET /v1/deployment), then
// show the panels its pipeline serves (speech; chat, and talk over /v1/realtime, which a
// chat pipeline serves too) and the live deployment view. When the
// server wants an API key, ask for it once and keep it in this tab's session storage.

import { Api, describe } from "./api.js";
import { ChatPanel } from "./chat.js";
import { DeploymentView } from "./deployment.js";
import { PcmPlayer } from "./player.js";
import { SpeechPanel } from "./speech.js";
import { TalkPanel } from "./talk.js";

const $ = (id) => document.getElementById(id);
let started = false;

function askForKey(error, hadKey) {
  const panel = $("key-panel");
  $("key-message").textContent = hadKey
    ? `The server refused this API key (${error.message}). Check it and enter it again.`
    : "This server needs an API key. Enter it to use the playground.";
  panel.dataset.reason = hadKey ? "invalid" : "missing";
  if (!panel.hidden) return; // asked already (the live view polls): leave what is typed alone
  panel.hidden = false;
  $("key-input").value = "";
  $("key-input").focus();
}

const api = new Api(askForKey);

function pageError(message) {
  $("page-error").textContent = message;
  $("page-error").hidden = !message;
}

async function start() {
  pageError("");
  let deployment;
  try {
    deployment = await api.json("v1/deployment");
  } catch (error) {
    if (error.status !== 401) pageError(`The deployment could not be read: ${describe(error)}`);
    $("summary").textContent = "Waiting for the server.";
    return;
  }
  started = true;
  $("key-panel").hidden = true;
  $("key-change").hidden = !api.key;
  const count = deployment.processes.length;
  $("summary").textContent =
    `${deployment.pipeline} · model ${deployment.model} · ${count} process${count === 1 ? "" : "es"}` +
    ` · serves ${deployment.api.join(" and ")}`;
  document.title = `omni playground: ${deployment.pipeline}`;
  // speech, chat, and talk (which comes with chat)
  const panels = ["speech", "chat", "chat"].filter((name) => deployment.api.includes(name));
  document.body.dataset.panels = String(panels.length);
  const player = new PcmPlayer();
  let voices = null;
  if (deployment.api.includes("speech")) {
    voices = await new SpeechPanel(api, deployment, player).init();
  }
  if (deployment.api.includes("chat")) {
    new ChatPanel(api, deployment, player, voices).init();
    new TalkPanel(api, deployment, voices).init();
  }
  await new DeploymentView(api, deployment).init();
  document.body.dataset.ready = "true";
}

$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  api.key = $("key-input").value.trim();
  $("key-panel").hidden = true;
  if (!started) start();
});

$("key-change").addEventListener("click", () => {
  askForKey(new Error(""), false);
  $("key-message").textContent = "Enter another API key for this tab.";
});

start();
