// The training timeline: a run's probe snapshots (GET /api/probes) under a step slider and a play button: at the step,
// the layer's heads, the head's map and the probe text's logit lens beside the val loss curve (no snapshots: hidden).
"use strict";

const TL = {info: null, snaps: new Map(), i: 0, playing: false};

async function startTimeline() {
  const info = TL.info = await (await fetch("api/probes")).json();
  if (!info.steps.length) return;
  $("timeline").hidden = false;
  Object.assign($("tl-slider"), {max: info.steps.length - 1, value: info.steps.length - 1}); // the trained model
  $("tl-slider").oninput = () => showStep(+$("tl-slider").value).catch(e => showError(e.message));
  $("play").onclick = () => play().catch(e => showError(e.message));
  await showStep(info.steps.length - 1);
}

async function showStep(i) {
  const step = TL.info.steps[TL.i = i];
  if (!TL.snaps.has(step)) {
    const r = await fetch(`api/probes/${step}`), out = await r.json();
    if (!r.ok) throw new Error(out.error);
    TL.snaps.set(step, {att: Float32Array.from(out.attention.flat(3)), lens: out.lens});
  }
  if (TL.i === i) renderTimeline(); // (a later choice, made while this one loaded, wins)
}

async function play() { // from the first step (or where the slider is), one step every 0.7 s; a click pauses
  TL.playing = !TL.playing;
  $("play").textContent = TL.playing ? "pause" : "play";
  for (let i = TL.i === TL.info.steps.length - 1 ? 0 : TL.i; TL.playing && i < TL.info.steps.length; i++) {
    $("tl-slider").value = i;
    await showStep(i);
    await new Promise(done => setTimeout(done, 700));
  }
  TL.playing = false;
  $("play").textContent = "play";
}

function renderTimeline() {
  const snap = TL.info && TL.snaps.get(TL.info.steps[TL.i]);
  if (!snap) return;
  const {steps, val_loss: val, tokens} = TL.info, step = steps[TL.i], T = tokens.length;
  const size = S.info.models[0].n_head * T * T, att = snap.att.subarray(S.layer * size, (S.layer + 1) * size);
  $("tl-layer").textContent = S.layer;
  $("tl-status").textContent = `step ${step} · val loss ${val[TL.i].toFixed(4)} · head ${S.head}`;
  Draw.curve($("tl-curve"), steps.map((s, i) => [s, val[i]]), step);
  Draw.heatmap($("tl-map"), headOf(att, S.head, T), T, {kind: "weights", sqrt: $("sqrt").checked, side: 380});
  renderHeads($("tl-heads"), att, T, $("sqrt").checked, "tl-map");
  Lens.grid($("tl-lens"), snap.lens, tokens);
  $("tl-map").dataset.step = step;
}
