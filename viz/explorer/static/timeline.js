// The training timeline: a run's probe snapshots (GET /api/probes) under a step slider and a play
// button: at the step, the layer's heads, the head's map and the probe text's logit lens beside the
// loss curve (the val loss of the evaluations, the train loss of the steps between); no snapshots:
// hidden. A saved page keeps every step's snapshot (savedTimeline): its slider and play work
// offline.
"use strict";

const TL = {info: null, snaps: new Map(), errors: new Map(), i: 0, playing: false, ready: null};

// saved: a saved page's timeline (savedTimeline's), else the server's.
async function startTimeline(saved) {
  const info = TL.info = saved ? saved.info : await (await fetch("api/probes")).json();
  for (const snap of saved ? saved.snaps : []) {
    TL.snaps.set(snap.step, {...snap, att: unb64(snap.att)});
  }
  if (!info.steps.length) return;
  $("timeline").hidden = false;
  // the trained model first, or the step the page was saved at
  const last = info.steps.length - 1, i = saved ? saved.i : last;
  Object.assign($("tl-slider"), {max: last, value: i});
  $("tl-slider").oninput = () => showStep(+$("tl-slider").value).catch(e => showError(e.message));
  $("play").onclick = () => play().catch(e => showError(e.message));
  await showStep(i);
}

// One step's snapshot from the server: its weights (layers x heads x T x T, counted in the file:
// the snapshots need not have the model's shape) and its lens.
async function loadStep(step) {
  const r = await fetch(`api/probes/${step}`), out = await r.json();
  if (!r.ok) throw new Error(out.error);
  const layers = out.attention.length, heads = layers ? out.attention[0].length : 0;
  return {att: Float32Array.from(out.attention.flat(3)), layers, heads, lens: out.lens};
}

async function showStep(i) {
  const step = TL.info.steps[TL.i = i];
  if (!TL.snaps.has(step) && !S.snapshot) {
    // at once: the step marked, its maps blank while it loads
    TL.errors.delete(step);
    renderTimeline();
    try {
      TL.snaps.set(step, await loadStep(step));
    } catch (err) {
      TL.errors.set(step, err.message);
      if (TL.i === i) renderTimeline();
      throw err;
    }
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

// Why the step's snapshot shows nothing for the selected layer and head ("": it shows them).
function stepMissing(step, snap) {
  const error = TL.errors.get(step);
  if (!snap && error) return `step ${step} could not be loaded: ${error}`;
  if (!snap && S.snapshot) return `step ${step} was not saved with the page`;
  if (!snap) return `loading step ${step}…`;
  const {layers, heads} = snap;
  if (S.layer >= layers) return `the snapshots have no layer ${S.layer} (they have ${layers})`;
  if (S.head >= heads) return `the snapshots have no head ${S.head} (they have ${heads})`;
  return "";
}

// The step's panels, each showing the step, layer and head its caption names, or blank saying why.
function renderTimeline() {
  if (!TL.info || !TL.info.steps.length) return;
  const {steps, val_loss: val, train_loss: train, tokens} = TL.info;
  const step = steps[TL.i], T = tokens.length, snap = TL.snaps.get(step);
  const why = stepMissing(step, snap), sqrt = $("sqrt").checked;
  $("tl-layer").textContent = S.layer;
  $("tl-status").textContent = `step ${step} · ${lossAt(TL.i)} · head ${S.head}`;
  const points = losses => steps.map((s, i) => [s, losses[i]]).filter(p => p[1] !== null);
  Draw.curve($("tl-curve"), [{name: "val loss", colour: "#ff7f0e", points: points(val)},
                             {name: "train loss (a batch)", colour: "#1f77b4", points: points(train)}], step, steps);
  $("tl-map-caption").textContent = why || `step ${step}: layer ${S.layer}, head ${S.head}`;
  if (snap) Lens.grid($("tl-lens"), snap.lens, tokens);
  else $("tl-lens").textContent = why;
  if (why) {
    Draw.blank($("tl-map"));
    $("tl-heads").textContent = "";
    return;
  }
  const size = snap.heads * T * T;
  const att = snap.att.subarray(S.layer * size, (S.layer + 1) * size);
  Draw.heatmap($("tl-map"), headOf(att, S.head, T), T, {kind: "weights", sqrt, side: 380});
  renderHeads($("tl-heads"), att, snap.heads, T, sqrt, "tl-map");
  Object.assign($("tl-map").dataset, {step, layer: S.layer, head: S.head});
}

// The timeline for a saved page: every step's snapshot (those not loaded yet are loaded now; one
// that cannot be is left out, and the saved page says so), the step shown; null when the run has no
// snapshots.
async function savedTimeline() {
  await TL.ready;
  if (!TL.info || !TL.info.steps.length) return null;
  for (const step of TL.info.steps.filter(s => !TL.snaps.has(s))) {
    try {
      TL.snaps.set(step, await loadStep(step));
    } catch (err) {
      TL.errors.set(step, err.message);
    }
  }
  const snaps = [...TL.snaps].map(([step, snap]) => ({...snap, step, att: b64(snap.att)}));
  return {info: TL.info, i: TL.i, snaps};
}
