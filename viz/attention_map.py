"""Draw a model's causal attention weights on a prompt as a layers x heads grid of heatmaps (a PNG).

Labels are the prompt's tokens made readable: whitespace shown, split UTF-8 characters marked with "…",
glyphs the installed fonts lack escaped rather than drawn as empty boxes.
"""
from __future__ import annotations

import os
import warnings

import numpy as np
import torch

from common.files import atomic_write, cache_dir

MAX_TOKENS = 64  # the prompt's last 64 tokens: more labels would not be readable
LABEL_FONTS = ("DejaVu Sans", "Noto Sans CJK JP", "Noto Sans CJK SC", "Noto Sans CJK TC", "Noto Sans CJK KR",
               "WenQuanYi Zen Hei", "Droid Sans Fallback", "Noto Sans", "Noto Emoji", "Symbola", "Arial Unicode MS")


def _matplotlib():
    """matplotlib, imported when a map is drawn (about a second), its font cache in tinygpt's cache, not in ~."""
    os.environ.setdefault("MPLCONFIGDIR", str(cache_dir() / "matplotlib"))
    import matplotlib.colors
    import matplotlib.figure  # no pyplot: no global backend state, renders with Agg
    import matplotlib.font_manager
    import matplotlib.ft2font
    return matplotlib


def label_fonts() -> tuple[list[str], set[int]]:
    """The installed LABEL_FONTS (matplotlib falls back along the list) and the code points they draw. A family
    of many files (DejaVu Sans ExtraLight, Condensed, ...) counts with its widest-coverage file, its regular face."""
    font_manager = _matplotlib().font_manager
    files: dict[str, list[str]] = {}
    for f in font_manager.fontManager.ttflist:
        files.setdefault(f.name, []).append(f.fname)
    families = [name for name in LABEL_FONTS if name in files] or ["DejaVu Sans"]
    glyphs: set[int] = set()
    for name in families:
        glyphs |= max((_charmap(path) for path in files.get(name, ())), key=len, default=set())
    return families, glyphs


def _charmap(path: str) -> set[int]:
    try:
        return set(_matplotlib().ft2font.FT2Font(path).get_charmap())
    except (OSError, RuntimeError):  # an unreadable or unsupported font file draws nothing
        return set()


def token_labels(tokenizer, ids: list[int], glyphs: set[int] | None = None) -> list[str]:
    """Readable axis labels, one per token: newline/space/tab made visible (⏎ · ⇥), a split multi-byte character
    shown whole with "…" on the cut side ("世…", "…世"), characters outside `glyphs` as \\u escapes."""
    if glyphs is None:
        glyphs = label_fonts()[1]
    parts = [tokenizer.decode_bytes([i]) for i in ids]
    data = b"".join(parts)
    is_cont = [(b & 0xC0) == 0x80 for b in data]  # UTF-8 continuation byte: not a character start
    labels, s = [], 0
    for part in parts:
        e = s + len(part)
        a, b = s, e
        while 0 < a < len(data) and is_cont[a]:
            a -= 1
        while b < len(data) and is_cont[b]:
            b += 1
        text = data[a:b].decode("utf-8", errors="backslashreplace")
        text = text.replace("\n", "⏎").replace(" ", "·").replace("\t", "⇥")
        text = "".join(c if c.isprintable() and ord(c) in glyphs  # else 世 -> \\u4e16, BEL -> \\x07
                       else c.encode("unicode_escape").decode("ascii") for c in text)
        labels.append(("…" if a < s else "") + text + ("…" if b > e else ""))
        s = e
    return labels


def draw_attention_map(model, tokenizer, ids: list[int], path, title: str = "") -> None:
    """A grid (rows = layers, columns = heads) of the causal attention weights of the prompt's last
    MAX_TOKENS tokens: row i of a heatmap = how much query token i attends to each key token j <= i."""
    ids = ids[-MAX_TOKENS:]
    device = next(model.parameters()).device
    att = model.attention_maps(torch.tensor([ids], device=device))[:, 0].float().cpu().numpy()  # (L, H, T, T)
    n_layer, n_head, T, _ = att.shape
    upper = np.triu(np.ones((T, T), dtype=bool), k=1)
    families, glyphs = label_fonts()
    labels = token_labels(tokenizer, ids, glyphs)

    cell = min(max(2.4, 0.15 * T + 1.0), 9.0)           # inches per heatmap: room for T labels
    cell = min(cell, 50 / max(n_layer, n_head))         # but keep the whole picture <= ~50 inches
    font = min(10.0, max(3.0, 0.9 * cell * 72 / T))     # a label per row/column of the heatmap
    mpl = _matplotlib()
    fig = mpl.figure.Figure(figsize=(n_head * cell + 2.0, n_layer * cell + 1.5), dpi=100, layout="constrained")
    axes = fig.subplots(n_layer, n_head, squeeze=False)
    norm = mpl.colors.PowerNorm(gamma=0.5, vmin=0.0, vmax=1.0)     # sqrt scale: small weights stay visible
    for l in range(n_layer):
        for h in range(n_head):
            ax = axes[l][h]
            im = ax.imshow(np.ma.masked_array(att[l, h], mask=upper), cmap="viridis", norm=norm,
                           interpolation="nearest")
            ax.set_facecolor("#eeeeee")  # the masked future (upper triangle)
            ax.set_xticks(range(T), labels if l == n_layer - 1 else [], rotation=90, fontsize=font, family=families)
            ax.set_yticks(range(T), labels if h == 0 else [], fontsize=font, family=families)
            ax.tick_params(length=0, pad=1)
            if l == 0:
                ax.set_title(f"head {h}", fontsize=11)
            if h == 0:
                ax.set_ylabel(f"layer {l}", fontsize=11)
    fig.colorbar(im, ax=axes, shrink=min(0.6, 4 / n_layer + 0.2), label="attention weight (sqrt scale)")
    fig.suptitle("causal self-attention weights: row = query token, column = key token it attends to\n"
                 f"{title + ', ' if title else ''}{T} prompt tokens (⏎ newline, · space)", fontsize=12)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*[Gg]lyph.*missing")  # e.g. CJK in DejaVu Sans
        with atomic_write(path) as f:  # whole or not at all, as loss.png (a Ctrl-C, a full disk)
            fig.savefig(f, format="png")
