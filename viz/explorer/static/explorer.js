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

async function ensureLayer() { // a layer not loaded yet for these tokens (large models load what is shown)
  const {ids, models} = S; // the tokens asked for: their maps are stored only while they are still shown
  for (let i = 0; i < models.length && !S.snapshot; i++) {
    if (S.layer >= S.info.models[i].n_layer || models[i].layers.has(S.layer)) continue;
    const h = await fetchLayers(i, {ids, layers: [S.layer], scores: true});
    if (S.models !== models) return;
    store(i, h);
  }
}

// ------------------------------------------------------------------------------------------------ panels
function layerData(i) { return S.models[i] && S.models[i].layers.get(S.layer); }

function headOf(arr, h, T) { return arr.subarray(h * T * T, (h + 1) * T * T); }

function render(ms) {
  const T = S.ids.length, t0 = performance.now();
  renderTimeline();
  if (!T) return;
  renderChips();
  const a = layerData(0), sqrt = $("sqrt").checked;
  const compare = S.models.length > 1, side = compare ? Math.max(360, Math.min(12 * T, 520))
                                               : Math.max(512, Math.min(12 * T, 800)); // labels up to ~64 tokens
  $("layer-shown").textContent = S.layer;
  $("head-shown").textContent = S.head;
  if (a) {
    Draw.heatmap($("map"), headOf(a.att, S.head, T), T, {kind: "weights", sqrt, labels: S.tokens, side});
    Draw.heatmap($("scores"), headOf(a.scores, S.head, T), T, {kind: "scores", labels: S.tokens, side: 300});
    const future = j => j % T > Math.floor(j / T); // key after query
    const masked = Float32Array.from(headOf(a.scores, S.head, T), (v, j) => (future(j) ? -Infinity : v));
    Draw.heatmap($("masked"), masked, T, {kind: "masked", labels: S.tokens, side: 300});
    Draw.heatmap($("softmax"), headOf(a.att, S.head, T), T, {kind: "weights", labels: S.tokens, side: 300});
    for (const id of ["map", "scores", "masked", "softmax"]) {
      Object.assign($(id).dataset, {layer: S.layer, head: S.head});
    }
    renderHeads($("heads"), a.att, T, sqrt, "map");
  } else {
    $("heads").textContent = S.snapshot ? "this layer was not loaded when the page was saved" : "loading…";
  }
  $("compare").hidden = !compare;
  if (compare) {
    const b = layerData(1), mb = S.info.models[1];
    const has = b && S.head < mb.n_head;
    $("map-b-caption").textContent = has ? `B: ${mb.name}` : `B has no layer ${S.layer} head ${S.head}`;
    if (has) {
      Draw.heatmap($("map-b"), headOf(b.att, S.head, T), T, {kind: "weights", sqrt, labels: S.tokens, side});
      const A = headOf(a.att, S.head, T), B = headOf(b.att, S.head, T);
      Draw.heatmap($("diff"), A.map((v, j) => v - B[j]), T, {kind: "diff", labels: S.tokens, side});
      for (const id of ["map-b", "diff"]) Object.assign($(id).dataset, {layer: S.layer, head: S.head});
    }
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

function renderHeads(grid, att, T, sqrt, map) { // thumbnails of a layer's heads; a click enlarges one in `map`
  const n = S.info.models[0].n_head;
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
  try {
    for (let n = +$("steps").value || 1; n > 0 && S.stepping; n--) {
      if (!(await append(sampleId()))) break;
    }
  } finally {
    S.stepping = false;
    $("step").textContent = "generate";
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
    render();
  };
  $("head").onchange = () => { S.head = +$("head").value; render(); };
  $("sqrt").onchange = () => render();
  $("temperature").oninput = renderNext;
  $("topk").oninput = renderNext;
  $("minp").oninput = renderNext;
  $("bars").onclick = e => {
    const i = Math.floor((e.offsetY - 2) / +$("bars").dataset.row);
    if (i >= 0 && i < NEXT.length) { S.chosen = i; Draw.bars($("bars"), NEXT, i); }
  };
  $("append").onclick = () => append(NEXT[S.chosen].id).catch(() => {});
  $("sample").onclick = () => append(sampleId()).catch(() => {});
  $("step").onclick = () => step().catch(() => {});
  $("save-html").onclick = () => saveHTML().catch(e => showError(e.message));
  for (const b of document.querySelectorAll("button.png")) {
    b.onclick = () => Draw.exportPanel(b.closest(".panel"), b.closest(".panel").id);
  }
  for (const c of document.querySelectorAll("canvas.map")) {
    c.addEventListener("mousemove", tooltip);
    c.addEventListener("mouseleave", () => { $("tooltip").hidden = true; });
  }
  if (S.snapshot) { render(); Lens.grid($("lens"), S.lens, S.tokens); return; }
  startTimeline().catch(e => showError(e.message));
  if (S.info.prompt) { $("prompt").value = S.info.prompt; runTokens({text: S.info.prompt}).catch(() => {}); }
}

start().catch(e => showError(e.message));
