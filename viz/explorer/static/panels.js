// The attention explorer's attention panels: the token chips, A's map, the three steps and the
// heads, B's map and A − B, and their tooltip. Each panel draws the selection (layer, head) its
// caption names, or is blank with its caption saying why (missing): never a picture of an earlier
// selection.
"use strict";

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
  // a map's side: labels up to ~64 tokens
  const compare = S.models.length > 1;
  const side = Math.max(compare ? 360 : 512, Math.min(12 * T, compare ? 520 : 800));
  const also = (label, why) => why && `${label}: ${why}`;
  const headA = () => headOf(a.att, S.head, T), scoresA = () => headOf(a.scores, S.head, T);
  $("layer-shown").textContent = S.layer;
  $("head-shown").textContent = S.head;
  figure("map", "A: weights", whyA,
         c => Draw.heatmap(c, headA(), T, {kind: "weights", sqrt, labels, side}));
  figure("scores", "1. scores q·k/√d", also("1. scores", whyA),
         c => Draw.heatmap(c, scoresA(), T, {kind: "scores", labels, side: 300}));
  // the future: a key after its query
  const future = j => j % T > Math.floor(j / T);
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
    const thumb = {kind: "weights", sqrt, side: 96, maxCell: 8, key: false};
    Draw.heatmap(c, headOf(att, h, T), T, thumb);
    fig.appendChild(c);
    const cap = document.createElement("figcaption");
    cap.textContent = `head ${h}`;
    fig.appendChild(cap);
    fig.onclick = () => {
      S.head = h;
      $("head").value = h;
      render();
      $(map).scrollIntoView({block: "nearest"});
    };
    grid.appendChild(fig);
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
