// Drawing for the attention explorer: heat maps on canvas (one pixel per cell, scaled up without smoothing, so
// 256 x 256 and more draw in a few milliseconds), the masked future drawn as hatched cells, each map's colour key on
// its canvas (so a PNG keeps it), the next-token bars, the loss curve, and a panel's canvases exported as one PNG.
// No library, no network.
"use strict";

const Draw = (() => {
  // viridis, sampled at 9 points and interpolated: dark purple (0) to yellow (1)
  const VIRIDIS = [[68, 1, 84], [71, 44, 122], [59, 81, 139], [44, 113, 142], [33, 144, 141],
                   [39, 173, 129], [92, 200, 99], [170, 220, 50], [253, 231, 37]];
  // colour tables as packed RGBA pixels (little-endian: 0xAABBGGRR), written straight into the image
  const pack = ([r, g, b]) => ((255 << 24) | (b << 16) | (g << 8) | r) >>> 0;
  const MASKED = pack([214, 214, 214]);
  const VIR = Uint32Array.from({length: 256}, (_, i) => {
    const x = i / 255 * (VIRIDIS.length - 1), j = Math.min(Math.floor(x), VIRIDIS.length - 2), f = x - j;
    return pack(VIRIDIS[j].map((c, n) => Math.round(c + f * (VIRIDIS[j + 1][n] - c))));
  });
  const DIV = Uint32Array.from({length: 511}, (_, i) => { // t = i / 255 - 1 in [-1, 1]: blue, white, red
    const t = i / 255 - 1;
    return pack((t < 0 ? [255 + t * 197, 255 + t * 152, 255 + t * 51]
                       : [255 - t * 77, 255 - t * 231, 255 - t * 212]).map(Math.round));
  });

  function hatch(ctx) { // the pattern of masked cells: grey with a thin diagonal line
    const p = document.createElement("canvas");
    p.width = p.height = 8;
    const c = p.getContext("2d");
    c.fillStyle = "rgb(214,214,214)";
    c.fillRect(0, 0, 8, 8);
    c.strokeStyle = "rgba(120,120,120,0.55)";
    c.beginPath(); c.moveTo(0, 8); c.lineTo(8, 0); c.stroke();
    return ctx.createPattern(p, "repeat");
  }

  // Heat map of a T x T matrix `m` (row = query, column = key) onto `canvas`, its colour key on the right.
  // opts: kind "weights" | "scores" | "masked" | "diff"; sqrt (weights); labels (token strings); side (px);
  // key (default true; false: a thumbnail's, none). The canvas keeps what hovering needs in its dataset: origin,
  // cell size, T.
  function heatmap(canvas, m, T, opts) {
    const kind = opts.kind, masked = kind !== "scores", key = opts.key !== false;
    const fit = (opts.side || 512) / T; // whole pixels per cell, or a fraction when T exceeds the side
    const cell = Math.min(fit >= 1 ? Math.floor(fit) : fit, opts.maxCell || 28);
    const labels = opts.labels && cell >= 10 ? opts.labels : null;
    delete canvas.dataset.blank;
    const margin = labels ? 56 : 2, side = Math.round(cell * T), keyHeight = Math.max(side, 90);
    canvas.width = margin + side + 2 + (key ? KEY_WIDTH : 0);
    canvas.height = margin + (key ? keyHeight : side) + 2;
    const ctx = canvas.getContext("2d");
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, canvas.width, canvas.height);

    let scale = 1; // the largest |value| over what is drawn, for scores and differences
    if (kind !== "weights") {
      scale = 0;
      for (let q = 0; q < T; q++) for (let k = 0; k < (masked ? q + 1 : T); k++) {
        scale = Math.max(scale, Math.abs(m[q * T + k]));
      }
      scale = scale || 1;
    }
    const img = new ImageData(T, T), px = new Uint32Array(img.data.buffer);
    const weights = kind === "weights", sqrt = !!opts.sqrt;
    for (let q = 0; q < T; q++) {
      for (let k = 0, o = q * T; k < T; k++, o++) {
        const v = m[o];
        if (masked && k > q) px[o] = MASKED;
        else if (weights) px[o] = VIR[Math.min(255, Math.round((sqrt ? Math.sqrt(v) : v) * 255))]; // v in [0, 1]
        else px[o] = DIV[Math.max(0, Math.min(510, Math.round((v / scale + 1) * 255)))];
      }
    }
    const tmp = document.createElement("canvas");
    tmp.width = tmp.height = T;
    tmp.getContext("2d").putImageData(img, 0, 0);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(tmp, margin, margin, side, side);
    if (masked && cell >= 4) { // the masked future (key after query) hatched: the upper triangle
      ctx.save();
      ctx.beginPath();
      for (let q = 0; q < T; q++) { // staircase along the diagonal
        ctx.lineTo(margin + (q + 1) * cell, margin + q * cell);
        ctx.lineTo(margin + (q + 1) * cell, margin + (q + 1) * cell);
      }
      ctx.lineTo(margin + side, margin);
      ctx.closePath();
      ctx.fillStyle = hatch(ctx);
      ctx.fill();
      ctx.restore();
    }
    if (labels) {
      ctx.fillStyle = "#333";
      ctx.font = `${Math.min(12, cell - 2)}px monospace`;
      ctx.textAlign = "right";
      ctx.textBaseline = "middle";
      for (let i = 0; i < T; i++) {
        ctx.fillText(shortLabel(labels[i]), margin - 4, margin + (i + 0.5) * cell);
        ctx.save();
        ctx.translate(margin + (i + 0.5) * cell, margin - 4);
        ctx.rotate(-Math.PI / 2);
        ctx.textAlign = "left";
        ctx.fillText(shortLabel(labels[i]), 0, 0);
        ctx.restore();
      }
    }
    Object.assign(canvas.dataset, {origin: margin, cell, t: T, kind, scale});
    if (key) colourKey(canvas, ctx, kind, sqrt, scale, margin + side + 14, margin + 6, keyHeight - 12);
  }

  // The colour key of a map: a bar from the top value's colour down to the bottom one's, and its ticks: weights 0 to
  // 1 (on the square-root scale the ticks sit where their colours are), scores and differences -scale to +scale (the
  // largest |value| drawn), and where the future is masked a hatched swatch. Its place and ticks go in the dataset.
  const KEY_WIDTH = 76;
  function colourKey(canvas, ctx, kind, sqrt, scale, x, top, height) {
    const weights = kind === "weights", masked = kind !== "scores", bar = masked ? height - 24 : height;
    const colour = f => { // f in [0, 1]: the bar's colour at that height (1: the top)
      const p = weights ? VIR[Math.round(f * 255)] : DIV[Math.round(f * 510)];
      return `rgb(${p & 255},${(p >>> 8) & 255},${(p >>> 16) & 255})`;
    };
    for (let y = 0; y < bar; y++) {
      ctx.fillStyle = colour(1 - y / (bar - 1));
      ctx.fillRect(x, top + y, 12, 1);
    }
    const ticks = !weights ? [-1, -0.5, 0, 0.5, 1] : sqrt ? [0, 0.05, 0.2, 0.5, 1] : [0, 0.25, 0.5, 0.75, 1];
    const text = t => (weights ? String(t) : t === 0 ? "0" : (t * scale).toPrecision(2));
    ctx.fillStyle = "#333";
    ctx.font = "10px sans-serif";
    ctx.textAlign = "left";
    ctx.textBaseline = "middle";
    for (const t of ticks) {
      const y = top + Math.round((1 - (weights ? (sqrt ? Math.sqrt(t) : t) : (t + 1) / 2)) * (bar - 1));
      ctx.fillRect(x + 12, y, 4, 1);
      ctx.fillText(text(t), x + 19, y);
    }
    if (masked) {
      ctx.fillStyle = hatch(ctx);
      ctx.fillRect(x, top + height - 14, 12, 12);
      ctx.fillStyle = "#333";
      ctx.fillText("masked", x + 16, top + height - 8);
    }
    Object.assign(canvas.dataset, {keyX: x, keyTop: top, keyBar: bar, ticks: ticks.map(text).join(" ")});
  }

  function shortLabel(s) {
    const v = visible(s);
    return v.length > 7 ? v.slice(0, 6) + "…" : v;
  }

  function visible(s) { // whitespace made visible, as on the chips
    return s.replace(/\n/g, "⏎").replace(/\t/g, "⇥").replace(/ /g, "·") || "∅";
  }

  // The cell under a mouse event on a heat map canvas: {q, k} or null.
  function cellAt(canvas, event) {
    const r = canvas.getBoundingClientRect(), d = canvas.dataset;
    const x = (event.clientX - r.left) * canvas.width / r.width - d.origin;
    const y = (event.clientY - r.top) * canvas.height / r.height - d.origin;
    const q = Math.floor(y / d.cell), k = Math.floor(x / d.cell);
    return q >= 0 && k >= 0 && q < +d.t && k < +d.t ? {q, k} : null;
  }

  // Horizontal bars: items [{label, prob}], the chosen index highlighted.
  function bars(canvas, items, chosen) {
    const row = 20, width = 460, labelW = 120;
    canvas.width = width;
    canvas.height = Math.max(1, items.length) * row + 4;
    delete canvas.dataset.blank;
    const ctx = canvas.getContext("2d");
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, canvas.width, canvas.height);
    ctx.font = "12px monospace";
    ctx.textBaseline = "middle";
    const top = Math.max(1e-12, ...items.map(it => it.prob));
    items.forEach((it, i) => {
      const y = 2 + i * row;
      ctx.fillStyle = i === chosen ? "#fde725" : "#3b518b";
      ctx.fillRect(labelW, y + 2, (width - labelW - 70) * it.prob / top, row - 4);
      ctx.fillStyle = "#222";
      ctx.textAlign = "right";
      ctx.fillText(shortLabel(it.label), labelW - 6, y + row / 2);
      ctx.textAlign = "left";
      ctx.fillText((100 * it.prob).toFixed(2) + "%", width - 64, y + row / 2);
    });
    canvas.dataset.row = row;
  }

  // Loss against step: each series {name, colour, points: [[step, loss]]} joined, named in a key; the steps on a log
  // scale (of 1 + step: the snapshots are log-spaced, so they spread evenly) spanning `domain` (every snapshot's step,
  // so the mark always shows), the losses spanning theirs; the step `mark` as a vertical line. The axes' ends go in
  // the dataset.
  function curve(canvas, series, mark, domain) {
    const w = canvas.width = 360, h = canvas.height = 220, pad = 36, ctx = canvas.getContext("2d");
    const losses = series.flatMap(s => s.points.map(p => p[1]));
    const x0 = Math.min(...domain), x1 = Math.max(...domain), span = Math.max(1e-9, Math.log1p(x1) - Math.log1p(x0));
    const y0 = losses.length ? Math.min(...losses) : 0, y1 = Math.max(y0 + 1e-3, ...losses);
    const X = s => pad + (Math.log1p(s) - Math.log1p(x0)) / span * (w - pad - 10);
    const Y = v => 10 + (y1 - v) / (y1 - y0) * (h - pad - 10);
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, w, h);
    ctx.fillStyle = "#333";
    ctx.font = "11px sans-serif";
    const labels = [[String(x0), pad, h - pad + 14], [`step ${x1}`, w - 60, h - pad + 14],
                    ["steps on a log scale", pad + 80, h - pad + 28]];
    for (let t = 10; t < x1; t *= 10) { // the powers of ten between the ends, ticked
      if (X(t) - X(x0) > 24 && X(x1) - X(t) > 64) labels.push([String(t), X(t) - 6, h - pad + 14]);
    }
    labels.push(...(losses.length ? [[y1.toFixed(2), 2, 18], [y0.toFixed(2), 2, h - pad]]
                                  : [["no loss recorded", pad + 20, h / 2]]));
    for (const [text, x, y] of labels) ctx.fillText(text, x, y);
    ctx.strokeStyle = "#f4b400";
    ctx.beginPath();
    ctx.moveTo(X(mark), 10);
    ctx.lineTo(X(mark), h - pad);
    ctx.stroke();
    series.filter(s => s.points.length).forEach((s, i) => {
      ctx.strokeStyle = ctx.fillStyle = s.colour;
      ctx.beginPath();
      s.points.forEach(([step, v]) => ctx.lineTo(X(step), Y(v)));
      ctx.stroke();
      for (const [step, v] of s.points) ctx.fillRect(X(step) - 3, Y(v) - 3, 6, 6);
      ctx.fillRect(w - 150, 14 + 14 * i, 12, 3); // the key, top right (where a falling loss leaves room)
      ctx.fillStyle = "#333";
      ctx.fillText(s.name, w - 134, 18 + 14 * i);
    });
    Object.assign(canvas.dataset, {x0, x1, y0, y1});
  }

  // A canvas with nothing to show for the selection (its caption says why): its pixels cleared,
  // nothing to hover (no cell size), nothing to export; never a picture of another selection.
  function blank(canvas) {
    canvas.getContext("2d").clearRect(0, 0, canvas.width, canvas.height);
    for (const name of Object.keys(canvas.dataset)) delete canvas.dataset[name];
    canvas.dataset.blank = "";
  }

  // All canvases of a panel side by side (captions under them) as one PNG download; blank ones
  // left out.
  function exportPanel(panel, name) {
    const canvases = [...panel.querySelectorAll("canvas")]
      .filter(c => c.offsetParent !== null && c.width > 1 && !("blank" in c.dataset));
    if (!canvases.length) return;
    const gap = 12, caption = 18;
    const w = canvases.reduce((s, c) => s + c.width + gap, gap), h = Math.max(...canvases.map(c => c.height));
    const out = document.createElement("canvas");
    out.width = w;
    out.height = h + caption + gap * 2;
    const ctx = out.getContext("2d");
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, out.width, out.height);
    ctx.fillStyle = "#222";
    ctx.font = "13px sans-serif";
    let x = gap;
    for (const c of canvases) {
      ctx.drawImage(c, x, gap);
      ctx.fillText(c.getAttribute("aria-label") || "", x, gap + h + caption - 4);
      x += c.width + gap;
    }
    out.toBlob(blob => Draw.download(blob, name + ".png"), "image/png"); // through Draw: a test can catch it
  }

  function download(blob, name) {
    const a = document.createElement("a");
    a.href = URL.createObjectURL(blob);
    a.download = name;
    document.body.appendChild(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 1000);
  }

  return {heatmap, blank, cellAt, bars, curve, exportPanel, download, visible};
})();
