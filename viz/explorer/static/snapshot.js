// Saving the view as one standalone HTML file: the page's markup, style and code inlined, the data
// loaded so far and the training timeline's snapshots embedded as base64 float32 (window.SNAPSHOT),
// so it opens offline with no server; and reading it back.
// Inside a <script> element the HTML parser still reads "</script", "<!--" and "<script" (the last two can make it
// miss the real end tag), so none of them may appear there as they are: the data is JSON with <, >, & and U+2028/9
// as \u escapes (any text a prompt, a token or a model's name holds stays inside its string), and the page's own
// code has such a "<" as \x3C, the same character in the strings and regular expressions where it can occur (the
// style, our own CSS, only needs "</style" kept out).
"use strict";

const inlineData = value => JSON.stringify(value)
  .replace(/[<>&\u2028\u2029]/g, c => "\\u" + c.charCodeAt(0).toString(16).padStart(4, "0"));
const inlineCode = code => code.replace(/<(?=!--|\/?script)/gi, "\\x3C");
const inlineStyle = css => css.replace(/<\/style/gi, "<\\/style");

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

// The view as it is (the selection, the settings in the boxes) and all the data it has, with every
// step of the training timeline.
async function saveHTML() {
  const timeline = await savedTimeline(), settings = SETTING_BOXES.map(id => [id, $(id).value]);
  const snap = {info: S.info, ids: S.ids, tokens: S.tokens, layer: S.layer, head: S.head,
                labels: [...S.labels], prompt: $("prompt").value, lens: S.lens, settings, timeline,
                models: S.models.map(m => ({logits: b64(m.logits), layers: [...m.layers].map(
                  ([l, d]) => [l, b64(d.att), b64(d.scores)])}))};
  const scripts = ["draw.js", "snapshot.js", "next.js", "lens.js", "panels.js", "timeline.js",
                   "explorer.js"];
  const [css, ...code] = await Promise.all(["explorer.css", ...scripts].map(source));
  const html = `<!doctype html>\n<html lang="en"><head><meta charset="utf-8">
<title>attention explorer: saved view</title>
<link rel="icon" href="data:,"><style id="src-explorer-css">${inlineStyle(css)}</style></head><body>${TEMPLATE}
<script>window.SNAPSHOT = ${inlineData(snap)};</script>
${scripts.map((name, i) => `<script id="src-${name.replace(".", "-")}">${inlineCode(code[i])}</script>`).join("\n")}
</body></html>`;
  Draw.download(new Blob([html], {type: "text/html"}), "attention-explorer.html");
}

function loadSnapshot(snap) {
  Object.assign(S, {info: snap.info, ids: snap.ids, tokens: snap.tokens, layer: snap.layer, head: snap.head,
                    labels: new Map(snap.labels), lens: snap.lens});
  const layers = m => new Map(m.layers.map(([l, a, s]) => [l, {att: unb64(a), scores: unb64(s)}]));
  S.models = snap.models.map(m => ({logits: unb64(m.logits), layers: layers(m)}));
  $("prompt").value = snap.prompt;
  for (const [id, value] of snap.settings) $(id).value = value;
  $("prompt").disabled = true;
}
