// The training timeline: a run's probe snapshots (GET /api/probes), one per evaluation, under a step slider and a
// play button. At the chosen step it shows the chosen layer's heads, the chosen head's map and the logit lens of the
// probe text, beside the loss curve with the step marked. A run without snapshots keeps the panel hidden.
"use strict";

const TL = {info: null, snaps: new Map(), i: 0, playing: false};

async function startTimeline() {
  if (S.snapshot) return;
  const info = await (await fetch("api/probes")).json();
  if (!info.steps || !info.steps.length) return;
  TL.info = info;
  $("timeline").hidden = false;
  const slider = $("tl-slider");
  slider.max = info.steps.length - 1;
  slider.value = info.steps.length - 1; // the trained model first; play starts from step 0
  slider.oninput = () => showStep(+slider.value).catch(e => showError(e.message));
  $("play").onclick = () => play().catch(e => showError(e.message));
  await showStep(info.steps.length - 1);
}

async function showStep(i) {
  TL.i = i;
  const step = TL.info.steps[i];
  if (!TL.snaps.has(step)) {
    const r = await fetch(`api/probes/${step}`), out = await r.json();
    if (!r.ok) throw new Error(out.error);
    TL.snaps.set(step, {att: Float32Array.from(out.attention.flat(3)), lens: out.lens});
  }
  if (TL.i === i) renderTimeline(); // (a later choice, made while this one loaded, wins)
}

async function play() {
  if (TL.playing) { TL.playing = false; return; }
  TL.playing = true;
  $("play").textContent = "pause";
  try {
    for (let i = TL.i === TL.info.steps.length - 1 ? 0 : TL.i; i < TL.info.steps.length && TL.playing; i++) {
      $("tl-slider").value = i;
      await showStep(i);
      await new Promise(done => setTimeout(done, 700));
    }
  } finally {
    TL.playing = false;
    $("play").textContent = "play";
  }
}

function renderTimeline() {
  const snap = TL.info && TL.snaps.get(TL.info.steps[TL.i]);
  if (!snap) return;
  const {steps, val_loss: val, train_loss: train, tokens} = TL.info, step = steps[TL.i], T = tokens.length;
  const m = S.info.models[0], size = m.n_head * T * T, sqrt = $("sqrt").checked;
  const att = snap.att.subarray(S.layer * size, (S.layer + 1) * size);
  $("tl-layer").textContent = S.layer;
  $("tl-status").textContent = `step ${step} of ${steps[steps.length - 1]}` +
    (val[TL.i] === null ? "" : ` · val loss ${val[TL.i].toFixed(4)}`);
  Draw.curve($("tl-curve"), train, steps.map((s, i) => [s, val[i]]).filter(p => p[1] !== null), step);
  Draw.heatmap($("tl-map"), headOf(att, S.head, T), T, {kind: "weights", sqrt, labels: tokens, side: 380});
  $("tl-map-caption").textContent = `head ${S.head}`;
  renderHeads($("tl-heads"), att, T, sqrt, "tl-map");
  Lens.grid($("tl-lens"), snap.lens, tokens);
  $("tl-map").dataset.step = step;
}
