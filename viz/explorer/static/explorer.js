// The attention explorer page: state, the server's compact binary answers and the actions. The
// attention panels are panels.js's, drawing draw.js's, the next-token panel next.js's, the logit
// lens lens.js's, the training timeline timeline.js's, saving the view as standalone HTML
// (window.SNAPSHOT set: no server, the data embedded) snapshot.js's.
"use strict";

const $ = id => document.getElementById(id);
const S = {
  info: null, snapshot: !!window.SNAPSHOT, ids: [], tokens: [], layer: 0, head: 0, gen: 0,
  models: [], // per model: {layers: Map(layer -> {att, scores}), logits}
  chosen: 0, stepping: false,
};
const TEMPLATE = $("app").outerHTML; // the page before data: what a saved HTML file starts from

// ------------------------------------------------------------------------------------------------ server
async function fetchLayers(model, body) {
  const r = await fetch("api/attention.bin", {method: "POST", headers: {"Content-Type": "application/json"},
                                                body: JSON.stringify({...body, model})});
  const buf = await r.arrayBuffer();
  if (!r.ok) throw new Error(JSON.parse(new TextDecoder().decode(buf)).error);
  const n = new DataView(buf).getUint32(0, true);
  const head = JSON.parse(new TextDecoder().decode(new Uint8Array(buf, 4, n)));
  head.data = {};
  for (const a of head.arrays) {
    const size = a.shape.reduce((x, y) => x * y, 1);
    head.data[a.name + (a.layer === null ? "" : a.layer)] = new Float32Array(buf, 4 + n + a.offset, size);
  }
  return head;
}

function showError(message) {
  const e = $("error");
  e.textContent = message ? "error: " + message : "";
  e.hidden = !message;
}

function layersToLoad(i, T) { // every layer when their weights are few (at most 2^20), else the one shown
  const m = S.info.models[i];
  if (m.n_layer * m.n_head * T * T <= (1 << 20)) return [...Array(m.n_layer).keys()];
  return S.layer < m.n_layer ? [S.layer] : [];
}

// New tokens (text typed, or ids after an append): the server runs the model(s) once, the page keeps the rest.
// The page takes the new tokens only once every model has answered for them, so tokens and maps always agree.
async function runTokens(source) {
  const gen = ++S.gen, t0 = performance.now();
  try {
    const guess = source.ids ? source.ids.length : source.text.length; // tokens: at most one per character
    const heads = [await fetchLayers(0, {...source, layers: layersToLoad(0, guess), scores: true, logits: true})];
    const ids = heads[0].ids;
    for (let i = 1; i < S.info.models.length && gen === S.gen; i++) {
      heads.push(await fetchLayers(i, {ids, layers: layersToLoad(i, ids.length), scores: true, logits: true}));
    }
    const lens = await Lens.load(ids);
    if (gen !== S.gen) return null;
    S.ids = ids;
    S.lens = lens;
    S.tokens = heads[0].tokens;
    S.labels = new Map(heads[0].next.map(n => [n.id, n.token])); // top 20 by logit: every bar's token, any setting
    S.models = heads.map(h => ({layers: new Map(), logits: h.data.logits}));
    heads.forEach((h, i) => store(i, h));
    showError("");
    render(performance.now() - t0);
    Lens.grid($("lens"), S.lens, S.tokens);
    return heads[0];
  } catch (err) {
    if (gen === S.gen) showError(err.message);
    throw err;
  }
}

function store(i, head) {
  for (const a of head.arrays) {
    if (a.name === "attention") S.models[i].layers.set(a.layer, {att: head.data["attention" + a.layer],
                                                                 scores: head.data["scores" + a.layer]});
  }
}

// A layer not loaded yet for these tokens (large models load the one shown), drawn blank and
// captioned while it loads, and so if it fails; its maps are stored only while their tokens are
// still shown.
async function ensureLayer() {
  const {ids, models, layer} = S;
  const lacks = i => layer < S.info.models[i].n_layer && !models[i].layers.has(layer);
  const wanted = [...models.keys()].filter(lacks);
  if (S.snapshot || !wanted.length) return;
  render();
  try {
    for (const i of wanted) {
      const h = await fetchLayers(i, {ids, layers: [layer], scores: true});
      if (S.models !== models) return;
      store(i, h);
    }
  } catch (err) {
    S.unloaded = {models, layer};
    throw err;
  }
}

// ------------------------------------------------------------------------------------------------ actions
async function append(id) {
  const block = Math.min(...S.info.models.map(m => m.block_size));
  if (S.ids.length >= block) {
    showError(`the context is full (${block} tokens): shorten the text to go on`);
    return false;
  }
  S.chosen = 0;
  const head = await runTokens({ids: [...S.ids, id]});
  // the box holds the exact text of the ids (typing on re-tokenizes it); while the last token ends inside a
  // character no text holds them (text null), so it keeps the text before it
  if (head && head.text !== null) $("prompt").value = head.text;
  return true;
}

async function step() {
  if (S.stepping) { S.stepping = false; return; }
  S.stepping = true;
  $("step").textContent = "stop";
  enableButtons();
  try {
    for (let n = +$("steps").value || 1; n > 0 && S.stepping && S.probs; n--) {
      if (!(await append(sampleId()))) break;
    }
  } finally {
    S.stepping = false;
    $("step").textContent = "generate";
    enableButtons();
  }
}

// ------------------------------------------------------------------------------------------------ start
function fillSelect(sel, n, prefix) {
  sel.textContent = "";
  for (let i = 0; i < n; i++) sel.add(new Option(`${prefix} ${i}`, i));
}

async function start() {
  S.labels = new Map();
  if (S.snapshot) loadSnapshot(window.SNAPSHOT);
  else S.info = await (await fetch("api/info")).json();
  const m0 = S.info.models[0];
  fillSelect($("layer"), m0.n_layer, "layer");
  fillSelect($("head"), m0.n_head, "head");
  $("layer").value = S.layer;
  $("head").value = S.head;
  $("models").textContent = S.info.models.map((m, i) => `${"AB"[i]}: ${m.name} (${m.n_layer} layers, ` +
    `${m.n_head} heads, context ${m.block_size}, ${m.tokenizer})`).join(" · ");
  $("prompt").maxLength = 60000;
  let timer = null;
  $("prompt").addEventListener("input", () => {
    clearTimeout(timer);
    timer = setTimeout(() => runTokens({text: $("prompt").value}).catch(() => {}), 250);
  });
  $("layer").onchange = async () => {
    S.layer = +$("layer").value;
    await ensureLayer().catch(e => showError(e.message));
    // (a later choice, made while this one loaded, draws its own)
    if (S.layer === +$("layer").value) render();
  };
  $("head").onchange = () => { S.head = +$("head").value; render(); };
  $("sqrt").onchange = () => render();
  for (const id of SETTING_BOXES) $(id).oninput = renderNext;
  $("bars").onclick = e => {
    const i = Math.floor((e.offsetY - 2) / +$("bars").dataset.row);
    if (i >= 0 && i < NEXT.length) { S.chosen = i; Draw.bars($("bars"), NEXT, i); }
  };
  $("append").onclick = () => NEXT.length && append(NEXT[S.chosen].id).catch(() => {});
  $("sample").onclick = () => S.probs && append(sampleId()).catch(() => {});
  $("step").onclick = () => step().catch(() => {});
  $("save-html").onclick = () => saveHTML().catch(e => showError(e.message));
  for (const b of document.querySelectorAll("button.png")) {
    b.onclick = () => Draw.exportPanel(b.closest(".panel"), b.closest(".panel").id);
  }
  for (const c of document.querySelectorAll("canvas.map")) {
    c.addEventListener("mousemove", tooltip);
    c.addEventListener("mouseleave", () => { $("tooltip").hidden = true; });
  }
  // the training timeline: the server's, or the one a saved page holds (a run without one: none)
  const saved = S.snapshot ? window.SNAPSHOT.timeline : undefined;
  if (saved !== null) TL.ready = startTimeline(saved).catch(e => showError(e.message));
  if (S.snapshot) { render(); Lens.grid($("lens"), S.lens, S.tokens); return; }
  if (S.info.prompt) { $("prompt").value = S.info.prompt; runTokens({text: S.info.prompt}).catch(() => {}); }
}

start().catch(e => showError(e.message));
