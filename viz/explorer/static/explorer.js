// The attention explorer page: state, the server's compact binary answers, the panels and the actions. Drawing is
// draw.js's, the next-token panel next.js's, the logit lens lens.js's, the training timeline timeline.js's, saving
// the view as standalone HTML (window.SNAPSHOT set: no server, the data embedded) snapshot.js's.
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

// ------------------------------------------------------------------------------------------------ panels
function layerData(i) { return S.models[i] && S.models[i].layers.get(S.layer); }

function headOf(arr, h, T) { return arr.subarray(h * T * T, (h + 1) * T * T); }

// Why model i has no map for the selected layer and head ("": it has). A panel shows the selection
// its caption names, or is blank with this in its caption: never a picture left from an earlier
// selection.
function missing(i) {
  const m = S.info.models[i], who = "AB"[i], failed = S.unloaded || {};
  if (S.layer >= m.n_layer) return `${who} has no layer ${S.layer} (it has ${m.n_layer})`;
  if (S.head >= m.n_head) return `${who} has no head ${S.head} (it has ${m.n_head})`;
  if (layerData(i)) return "";
  if (S.snapshot) return `layer ${S.layer} of ${who} was not loaded when the page was saved`;
  if (failed.models === S.models && failed.layer === S.layer) {
    return `layer ${S.layer} of ${who} could not be loaded (the error above)`;
  }
  return `loading layer ${S.layer} of ${who}…`;
}

// A canvas and its caption: the selection drawn by draw(canvas), or, given a `why`, blank with
// `why` as its caption.
function figure(id, caption, why, draw) {
  const canvas = $(id);
  $(id + "-caption").textContent = why || caption;
  if (why) return Draw.blank(canvas);
  draw(canvas);
  Object.assign(canvas.dataset, {layer: S.layer, head: S.head});
}

function render(ms) {
  const T = S.ids.length, t0 = performance.now();
  renderTimeline();
  // no tokens yet: nothing has been drawn
  if (!T) return;
  renderChips();
  const a = layerData(0), whyA = missing(0), sqrt = $("sqrt").checked, labels = S.tokens;
  const compare = S.models.length > 1, side = compare ? Math.max(360, Math.min(12 * T, 520))
                                               : Math.max(512, Math.min(12 * T, 800)); // labels up to ~64 tokens
  const also = (label, why) => why && `${label}: ${why}`;
  const headA = () => headOf(a.att, S.head, T), scoresA = () => headOf(a.scores, S.head, T);
  $("layer-shown").textContent = S.layer;
  $("head-shown").textContent = S.head;
  figure("map", "A: weights", whyA,
         c => Draw.heatmap(c, headA(), T, {kind: "weights", sqrt, labels, side}));
  figure("scores", "1. scores q·k/√d", also("1. scores", whyA),
         c => Draw.heatmap(c, scoresA(), T, {kind: "scores", labels, side: 300}));
  const future = j => j % T > Math.floor(j / T); // key after query
  const maskedA = () => scoresA().map((v, j) => (future(j) ? -Infinity : v));
  figure("masked", "2. future set to −∞", also("2. masked", whyA),
         c => Draw.heatmap(c, maskedA(), T, {kind: "masked", labels, side: 300}));
  figure("softmax", "3. softmax: rows sum to 1", also("3. softmax", whyA),
         c => Draw.heatmap(c, headA(), T, {kind: "weights", labels, side: 300}));
  if (whyA) $("heads").textContent = whyA;
  else renderHeads($("heads"), a.att, S.info.models[0].n_head, T, sqrt, "map");
  $("compare").hidden = !compare;
  if (compare) {
    const whyB = missing(1), headB = () => headOf(layerData(1).att, S.head, T);
    figure("map-b", `B: ${S.info.models[1].name}`, whyB,
           c => Draw.heatmap(c, headB(), T, {kind: "weights", sqrt, labels, side}));
    figure("diff", "A − B (red: A attends more)", also("A − B", whyB || whyA), c => {
      const B = headB();
      Draw.heatmap(c, headA().map((v, j) => v - B[j]), T, {kind: "diff", labels, side});
    });
  }
  renderNext();
  const model = ms === undefined ? "" : ` · model ${ms.toFixed(0)} ms`;
  $("status").textContent = `${T} tokens${model} · drawn ${(performance.now() - t0).toFixed(0)} ms`;
  $("map").dataset.ready = S.gen;
}

function renderChips() {
  const chips = $("chips");
  chips.textContent = "";
  S.tokens.forEach((t, i) => {
    const c = document.createElement("span");
    c.className = "chip";
    c.textContent = Draw.visible(t);
    c.title = `token ${i}: id ${S.ids[i]}`;
    chips.appendChild(c);
  });
}

// Thumbnails of a layer's n heads; a click enlarges one in `map`.
function renderHeads(grid, att, n, T, sqrt, map) {
  grid.textContent = "";
  for (let h = 0; h < n; h++) {
    const fig = document.createElement("figure");
    fig.className = "thumb" + (h === S.head ? " selected" : "");
    const c = document.createElement("canvas");
    c.setAttribute("aria-label", `layer ${S.layer} head ${h}`);
    Draw.heatmap(c, headOf(att, h, T), T, {kind: "weights", sqrt, side: 96, maxCell: 8, key: false});
    fig.appendChild(c);
    const cap = document.createElement("figcaption");
    cap.textContent = `head ${h}`;
    fig.appendChild(cap);
    fig.onclick = () => { S.head = h; $("head").value = h; render(); $(map).scrollIntoView({block: "nearest"}); };
    grid.appendChild(fig);
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

function tooltip(event) {
  const c = event.target, tip = $("tooltip"), cell = Draw.cellAt(c, event);
  if (!cell || !S.ids.length) { tip.hidden = true; return; }
  const {q, k} = cell, T = S.ids.length, kind = c.dataset.kind;
  const a = layerData(0), j = S.head * T * T + q * T + k;
  const name = i => `${i} “${Draw.visible(S.tokens[i])}”`;
  let value;
  if (kind === "weights" && c.id === "map-b") value = `weight ${layerData(1).att[j].toFixed(6)}`;
  else if (kind === "weights") value = k > q ? "masked: weight 0" : `weight ${a.att[j].toFixed(6)}`;
  else if (kind === "scores") value = `score ${a.scores[j].toFixed(6)}`;
  else if (kind === "masked") value = k > q ? "masked: −∞" : `score ${a.scores[j].toFixed(6)}`;
  else value = `A − B ${(a.att[j] - layerData(1).att[j]).toFixed(6)}`;
  tip.innerHTML = "";
  tip.append(`query ${name(q)} → key ${name(k)}`, document.createElement("br"), value);
  tip.hidden = false;
  tip.style.left = event.pageX + 14 + "px";
  tip.style.top = event.pageY + 14 + "px";
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
