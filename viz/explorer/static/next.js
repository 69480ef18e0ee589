// The next-token panel: the distribution the page computes from the last position's logits,
// fetched once, under the temperature, top-k, top-p and min-p controls (as sample.py samples, so a
// slider never asks the server), its bars (only tokens that can be drawn) and the draw that
// "sample & append" and "generate" make from it.
"use strict";

// The settings' boxes, checked as model/sampling.py's Sampling checks sample.py's flags and the
// API's fields: the same values refused, with one line saying what to use. 0 turns top-k and min-p
// off, 1 top-p, and an empty box leaves its setting out (off too). A box's text is read as the API
// reads it as JSON, so "2.0" is no top-k, as {"top_k": 2.0} is none.
const SETTING_BOXES = ["temperature", "topk", "topp", "minp"];
const CHECKS = {
  topk: ["top-k", t => /^-?\d+$/.test(t) && +t >= 0, "a whole number >= 0 (0: no top-k filter)"],
  topp: ["top-p", t => +t > 0 && +t <= 1, "a number in (0, 1] (1: no top-p filter)"],
  minp: ["min-p", t => +t >= 0 && +t <= 1, "a number in [0, 1] (0: no min-p filter)"],
};
// model/sampling.py's GREEDY_BELOW: a temperature below it is greedy
const GREEDY_BELOW = 2 ** -126;

// {temperature, topk, topp, minp} (null: left out), or {error} naming the first box to fix.
function settings() {
  const out = {temperature: +$("temperature").value};
  let error = null;
  for (const [id, [name, ok, use]] of Object.entries(CHECKS)) {
    const box = $(id), text = box.value.trim(), unreadable = box.validity.badInput;
    const bad = unreadable || (text !== "" && !ok(text));
    box.classList.toggle("invalid", bad);
    const what = unreadable ? "is not a number" : `${text} is invalid`;
    if (bad && !error) error = `${name} ${what}: use ${use}`;
    out[id] = text === "" ? null : +text;
  }
  return error ? {error} : out;
}

// Probabilities under the settings, in logits_to_probs's order (model/generate.py): top-k (ties
// kept), the temperature and softmax, top-p (the fewest likeliest tokens whose mass reaches it),
// min-p; the top token always stays.
function distribution(logits, {temperature, topk, topp, minp}) {
  const V = logits.length, p = new Float64Array(V);
  if (temperature < GREEDY_BELOW) {
    p[logits.reduce((b, v, i) => (v > logits[b] ? i : b), 0)] = 1;
    return p;
  }
  const kth = topk ? Float32Array.from(logits).sort()[V - Math.min(topk, V)] : -Infinity;
  let max = -Infinity;
  for (let i = 0; i < V; i++) if (logits[i] >= kth) max = Math.max(max, logits[i]);
  for (let i = 0; i < V; i++) {
    p[i] = logits[i] >= kth ? Math.exp((logits[i] - max) / temperature) : 0;
  }
  cut(p, 0);
  if (topp !== null && topp < 1) {
    // a token goes once the likelier ones reach top-p: those below the last one kept (sorting the
    // values, not their ids, is fast; a tie at the cut keeps every token of it)
    const sorted = Float64Array.from(p).sort().reverse();
    let before = 0, m = 0;
    while (m < V && before < topp) before += sorted[m++];
    cut(p, sorted[m - 1]);
  }
  if (minp) cut(p, minp * maxOf(p));
  return p;
}

// Drops the probabilities below `least` and normalizes the rest.
function cut(p, least) {
  let sum = 0;
  for (let i = 0; i < p.length; i++) {
    if (p[i] < least) p[i] = 0;
    sum += p[i];
  }
  for (let i = 0; i < p.length; i++) p[i] /= sum;
}

function maxOf(p) {
  let top = 0;
  for (let i = 0; i < p.length; i++) top = Math.max(top, p[i]);
  return top;
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

// the bars shown: [{id, prob, label}]
let NEXT = [];

// The bars for the settings in the boxes; while a box holds a value the API would refuse, none: the
// canvas blank, its caption naming the box to fix, nothing to append or sample. (No tokens yet:
// nothing is drawn.)
function renderNext() {
  const m = S.models[0];
  $("temperature-shown").textContent = (+$("temperature").value).toFixed(2);
  if (!m || !m.logits) return;
  const set = settings(), p = S.probs = set.error ? null : distribution(m.logits, set);
  NEXT = !p ? [] : topN(p, 20).filter(id => p[id] > 0)
    .map(id => ({id, prob: p[id], label: S.labels.get(id) ?? `#${id}`}));
  S.chosen = Math.max(0, Math.min(S.chosen, NEXT.length - 1));
  enableButtons();
  if (!p) {
    $("bars-caption").textContent = set.error;
    return Draw.blank($("bars"));
  }
  let drawable = 0;
  for (let i = 0; i < p.length; i++) drawable += p[i] > 0;
  $("bars-caption").textContent =
    `the ${NEXT.length} likeliest of the ${drawable} tokens that can be drawn`;
  Draw.bars($("bars"), NEXT, S.chosen);
}

// A saved page appends nothing; generating can always be stopped.
function enableButtons() {
  const off = S.snapshot || !S.probs;
  $("append").disabled = $("sample").disabled = off;
  $("step").disabled = off && !S.stepping;
}

function sampleId() {
  const p = S.probs;
  let r = Math.random(), last = 0;
  for (let i = 0; i < p.length; i++) { if (p[i] > 0) { last = i; r -= p[i]; if (r <= 0) return i; } }
  return last;
}
