// Saving the view as one standalone HTML file: the page's markup, style and code inlined, the data loaded so far
// embedded as base64 float32 (window.SNAPSHOT), so it opens offline with no server; and reading it back.
"use strict";

function b64(arr) {
  const bytes = new Uint8Array(arr.buffer, arr.byteOffset, arr.byteLength);
  let s = "";
  for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  return btoa(s);
}

function unb64(text) {
  const s = atob(text), bytes = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) bytes[i] = s.charCodeAt(i);
  return new Float32Array(bytes.buffer);
}

async function source(name) {
  if (S.snapshot) return document.getElementById("src-" + name.replace(".", "-")).textContent;
  return (await fetch(name)).text();
}

async function saveHTML() {
  const snap = {info: S.info, ids: S.ids, tokens: S.tokens, layer: S.layer, head: S.head,
                labels: [...S.labels], prompt: $("prompt").value,
                models: S.models.map(m => ({logits: b64(m.logits), layers: [...m.layers].map(
                  ([l, d]) => [l, b64(d.att), b64(d.scores)])}))};
  const names = ["explorer.css", "draw.js", "snapshot.js", "explorer.js"];
  const [css, draw, save, js] = await Promise.all(names.map(source));
  const safe = s => s.replace(/<\/(script|style)/gi, "<\\/$1");
  const html = `<!doctype html>\n<html lang="en"><head><meta charset="utf-8">
<title>attention explorer: saved view</title>
<link rel="icon" href="data:,"><style id="src-explorer-css">${safe(css)}</style></head><body>${TEMPLATE}
<script>window.SNAPSHOT = ${safe(JSON.stringify(snap))};</script>
<script id="src-draw-js">${safe(draw)}</script><script id="src-snapshot-js">${safe(save)}</script>
<script id="src-explorer-js">${safe(js)}</script></body></html>`;
  Draw.download(new Blob([html], {type: "text/html"}), "attention-explorer.html");
}

function loadSnapshot(snap) {
  Object.assign(S, {info: snap.info, ids: snap.ids, tokens: snap.tokens, layer: snap.layer, head: snap.head,
                    labels: new Map(snap.labels)});
  const layers = m => new Map(m.layers.map(([l, a, s]) => [l, {att: unb64(a), scores: unb64(s)}]));
  S.models = snap.models.map(m => ({logits: unb64(m.logits), layers: layers(m)}));
  $("prompt").value = snap.prompt;
  for (const id of ["prompt", "append", "sample", "step"]) $(id).disabled = true;
}
