// The logit lens grid (model/lens.py's numbers): a row per layer (the residual stream after the embedding and after
// each block, through the final norm and head), a column per position; each cell shows the top next token, coloured
// by its probability, and hovering it lists the top 5. The typed text's lens comes from POST /api/lens; the
// timeline draws a probe snapshot's with the same grid.
"use strict";

const Lens = (() => {
  async function load(ids) {
    const r = await fetch("api/lens", {method: "POST", headers: {"Content-Type": "application/json"},
                                       body: JSON.stringify({ids, top: 5})});
    const out = await r.json();
    if (!r.ok) throw new Error(out.error);
    return out.lens;
  }

  const rowName = (l, n) => (l === 0 ? "embedding" : `layer ${l - 1}` + (l === n - 1 ? " (output)" : ""));
  const label = t => { const v = Draw.visible(t); return v.length > 6 ? v.slice(0, 5) + "…" : v; };

  function grid(el, lens, tokens) { // lens [layer][position] -> [{token, id, prob}, ...], most likely first
    const table = document.createElement("table"), top = table.insertRow();
    top.appendChild(document.createElement("th")).textContent = "input →";
    for (const t of tokens) top.appendChild(document.createElement("th")).textContent = label(t);
    lens.forEach((row, l) => {
      const tr = table.insertRow();
      tr.appendChild(document.createElement("th")).textContent = rowName(l, lens.length);
      row.forEach((cell, i) => {
        const td = tr.insertCell();
        td.textContent = label(cell[0].token);
        td.style.background = `rgba(33, 144, 141, ${cell[0].prob.toFixed(3)})`; // teal: opaque at probability 1
        Object.assign(td.dataset, {layer: l, pos: i});
      });
    });
    table.onmousemove = e => hover(e, lens, tokens);
    table.onmouseleave = () => { $("tooltip").hidden = true; };
    el.replaceChildren(table);
  }

  function hover(event, lens, tokens) {
    const td = event.target.closest("td"), tip = $("tooltip");
    if (!td) { tip.hidden = true; return; }
    const l = +td.dataset.layer, i = +td.dataset.pos;
    tip.textContent = [`${rowName(l, lens.length)}, after ${i} “${Draw.visible(tokens[i])}”: next`,
                       ...lens[l][i].map(c => `“${Draw.visible(c.token)}” ${(100 * c.prob).toFixed(1)}%`)].join("\n");
    tip.hidden = false;
    tip.style.left = event.pageX + 14 + "px";
    tip.style.top = event.pageY + 14 + "px";
  }

  return {load, grid};
})();
