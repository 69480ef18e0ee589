// The logit lens grid (model/lens.py): a row per layer (the residual stream after the embedding and each block, through
// the final norm and head), a column per position; a cell shows the top next token, coloured by its probability (the
// key under the grid), the top 5 on hover. The typed text's lens comes from POST /api/lens, a probe snapshot's from
// the timeline.
"use strict";

const Lens = (() => {
  async function load(ids) {
    const r = await fetch("api/lens", {method: "POST", headers: {"Content-Type": "application/json"},
                                       body: JSON.stringify({ids, top: 5})}), out = await r.json();
    if (!r.ok) throw new Error(out.error);
    return out.lens;
  }

  const rowName = (l, n) => (l === 0 ? "embedding" : `layer ${l - 1}` + (l === n - 1 ? " (output)" : ""));
  const label = t => { const v = Draw.visible(t); return v.length > 6 ? v.slice(0, 5) + "…" : v; };

  const teal = p => `rgba(33, 144, 141, ${p.toFixed(3)})`; // a cell's colour: opaque at probability 1

  function key() { // the colours' meaning, under the grid
    const div = document.createElement("div"), bar = document.createElement("span");
    div.className = "key";
    bar.className = "ramp";
    bar.style.background = `linear-gradient(to right, ${teal(0)}, ${teal(1)})`;
    div.append("colour: the top token's probability, 0 ", bar, " 1");
    return div;
  }

  function grid(el, lens, tokens) { // lens [layer][position] -> [{token, id, prob}, ...], most likely first
    const table = document.createElement("table"), top = table.insertRow();
    for (const t of ["input →", ...tokens.map(label)]) top.appendChild(document.createElement("th")).textContent = t;
    lens.forEach((row, l) => {
      const tr = table.insertRow();
      tr.appendChild(document.createElement("th")).textContent = rowName(l, lens.length);
      for (const c of row) {
        const td = tr.insertCell();
        td.textContent = label(c[0].token);
        td.style.background = teal(c[0].prob);
      }
    });
    table.onmousemove = e => hover(e, lens, tokens);
    table.onmouseleave = () => { $("tooltip").hidden = true; };
    el.replaceChildren(table, key());
  }

  function hover(event, lens, tokens) {
    const td = event.target.closest("td"), tip = $("tooltip");
    tip.hidden = !td;
    if (!td) return;
    const l = td.parentElement.rowIndex - 1, i = td.cellIndex - 1;
    const top = lens[l][i].map(c => `“${Draw.visible(c.token)}” ${(100 * c.prob).toFixed(1)}%`);
    tip.textContent = [`${rowName(l, lens.length)} at ${i} “${Draw.visible(tokens[i])}”: next`, ...top].join("\n");
    Object.assign(tip.style, {left: event.pageX + 14 + "px", top: event.pageY + 14 + "px"});
  }

  return {load, grid};
})();
