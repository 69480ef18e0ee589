// The next-token panel: the distribution the page computes from the last position's logits, fetched once, under
// the temperature, top-k and min-p controls (as sample.py samples, so a slider never asks the server), its bars
// (only tokens that can be drawn) and the draw that "sample & append" and "generate" make from it.
"use strict";

function distribution(logits) {
  const temp = +$("temperature").value, k = Math.max(0, Math.floor(+$("topk").value || 0));
  const minP = Math.min(1, Math.max(0, +$("minp").value || 0));
  const V = logits.length, p = new Float64Array(V);
  if (temp === 0) { p[logits.reduce((b, v, i) => (v > logits[b] ? i : b), 0)] = 1; return p; }
  let kth = -Infinity;
  if (k > 0 && k < V) kth = Float32Array.from(logits).sort()[V - k];
  let max = -Infinity;
  for (let i = 0; i < V; i++) if (logits[i] >= kth) max = Math.max(max, logits[i] / temp);
  let sum = 0;
  for (let i = 0; i < V; i++) {  // the top token's is exp(0) = 1, so min-p keeps the tokens with p >= minP
    p[i] = logits[i] >= kth ? Math.exp(logits[i] / temp - max) : 0;
    if (p[i] < minP) p[i] = 0;
    sum += p[i];
  }
  for (let i = 0; i < V; i++) p[i] /= sum;
  return p;
}

function topN(p, n) {
  const idx = [];
  for (let i = 0; i < p.length; i++) {
    if (idx.length < n || p[i] > p[idx[idx.length - 1]]) {
      idx.push(i);
      idx.sort((x, y) => p[y] - p[x]);
      if (idx.length > n) idx.pop();
    }
  }
  return idx;
}

let NEXT = []; // the bars shown: [{id, prob, label}]
function renderNext() {
  const m = S.models[0];
  if (!m || !m.logits) return;
  $("temperature-shown").textContent = (+$("temperature").value).toFixed(2);
  const p = distribution(m.logits);
  NEXT = topN(p, 20).filter(id => p[id] > 0).map(id => ({id, prob: p[id], label: S.labels.get(id) ?? `#${id}`}));
  S.chosen = Math.min(S.chosen, NEXT.length - 1);
  Draw.bars($("bars"), NEXT, S.chosen);
  S.probs = p;
}

function sampleId() {
  const p = S.probs;
  let r = Math.random(), last = 0;
  for (let i = 0; i < p.length; i++) { if (p[i] > 0) { last = i; r -= p[i]; if (r <= 0) return i; } }
  return last;
}
