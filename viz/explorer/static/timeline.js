// The training timeline: a run's probe snapshots (GET /api/probes) under a step slider and a play button: at the step,
// the layer's heads, the head's map and the probe text's logit lens beside the loss curve (the val loss of the
// evaluations, the train loss of the steps between), no snapshots: hidden.
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

function lossAt(i) { // a snapshot's loss, and which: the evaluation's val loss, else the step's train loss
  const {val_loss: val, train_loss: train} = TL.info;
  if (val[i] !== null) return `val loss ${val[i].toFixed(4)}`;
  return train[i] !== null ? `train loss ${train[i].toFixed(4)} (the step's batch)` : "no loss (no evaluation)";
}

function renderTimeline() {
  const snap = TL.info && TL.snaps.get(TL.info.steps[TL.i]);
  if (!snap) return;
  const {steps, val_loss: val, train_loss: train, tokens} = TL.info, step = steps[TL.i], T = tokens.length;
  const size = S.info.models[0].n_head * T * T, att = snap.att.subarray(S.layer * size, (S.layer + 1) * size);
  $("tl-layer").textContent = S.layer;
  $("tl-status").textContent = `step ${step} · ${lossAt(TL.i)} · head ${S.head}`;
  const points = losses => steps.map((s, i) => [s, losses[i]]).filter(p => p[1] !== null);
  Draw.curve($("tl-curve"), [{name: "val loss", colour: "#ff7f0e", points: points(val)},
                             {name: "train loss (a batch)", colour: "#1f77b4", points: points(train)}], step, steps);
  Draw.heatmap($("tl-map"), headOf(att, S.head, T), T, {kind: "weights", sqrt: $("sqrt").checked, side: 380});
  renderHeads($("tl-heads"), att, T, $("sqrt").checked, "tl-map");
  Lens.grid($("tl-lens"), snap.lens, tokens);
  $("tl-map").dataset.step = step;
}
