"""What the explorer shows of one model: a text's tokens, the attention weights and raw scores of the layers asked,
and the last position's logits, all from one run of the model's own forward (no re-implementation of it).

The weights come from the attention modules' manual path, asked for with `need_weights` by a forward pre-hook on the
layers wanted (the others keep their fused kernel), and the raw scores from the `scores` hook point of that path; so
every model setting the model code supports is shown as it computes. The last tokens' results are kept, so asking
for another layer of the same tokens runs only that layer's hooks, and sliders never run the model.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from model.generate import Sampling, logits_to_probs
from model.lens import top_of_lens
from viz import probes

TOP_N = 20  # bars in the next-token panel


@dataclass
class Result:
    ids: list[int]
    logits: torch.Tensor  # (vocab,) float32 on CPU: the last position's, padded vocabulary rows dropped
    weights: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> (n_head, T, T) softmax weights
    scores: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> (n_head, T, T) q·k/sqrt(hs), unmasked


def attention_modules(model) -> list:
    """The model's attention modules in layer order: the one place that knows where they sit."""
    return [block.attn for block in model.transformer.h]


@torch.no_grad()
def forward_with_attention(model, ids: list[int], layers: list[int]) -> Result:
    """One forward of `model` on `ids`; for each of `layers`, the weights and raw scores its attention computed."""
    weights, scores, handles = {}, {}, []
    modules = attention_modules(model)

    def ask_weights(module, args, kwargs):
        return args, {**kwargs, "need_weights": True}

    for layer in layers:
        attn = modules[layer]
        handles.append(attn.register_forward_pre_hook(ask_weights, with_kwargs=True))
        handles.append(attn.register_forward_hook(lambda m, a, out, l=layer: weights.__setitem__(l, out[1][0])))
        handles.append(attn.scores.register_forward_hook(lambda m, a, out, l=layer: scores.__setitem__(l, out[0])))
    device = next(model.parameters()).device
    try:
        logits, _ = model(torch.tensor([ids], device=device), last_only=True)
    finally:
        for h in handles:
            h.remove()
    assert set(weights) == set(scores) == set(layers), "every layer asked must run the manual attention path"
    cpu = {l: w.float().cpu() for l, w in weights.items()}, {l: s.float().cpu() for l, s in scores.items()}
    return Result(list(ids), logits[0, -1].float().cpu(), *cpu)


class NonFiniteError(RuntimeError):
    """The model computed NaN or infinity: no reply can show it (JSON has no such numbers), and no map means much."""


def check_finite(result: Result) -> None:
    """NonFiniteError naming where, when the model's own numbers are not all finite (broken weights, an overflow)."""
    arrays = {}
    for l in sorted(result.weights):
        arrays[f"layer {l}'s scores"], arrays[f"layer {l}'s attention weights"] = result.scores[l], result.weights[l]
    arrays["the logits"] = result.logits
    bad = next((name for name, t in arrays.items() if not torch.isfinite(t).all()), None)
    if bad is not None:
        raise NonFiniteError(f"the model computed NaN or infinity in {bad}: are its weights finite? (a checkpoint "
                             "saved by train.py always is)")


def token_text(tokenizer, token_id: int) -> str:
    """A token's text; a piece of a multi-byte character shows its bytes (\\xe4) rather than a replacement mark."""
    return tokenizer.decode_bytes([token_id]).decode("utf-8", errors="backslashreplace")


def next_tokens(logits: torch.Tensor, ids: list[int], sampling: Sampling,
                n: int = TOP_N) -> list[tuple[int, float]]:
    """The n likeliest tokens after `ids` as (id, probability) under `sampling` (whose rules may
    read the ids), as sampled: only those that can be drawn (probability > 0), never a non-finite
    probability, whatever the division by the temperature made of the logits."""
    probs = logits_to_probs(logits, torch.tensor(ids, dtype=torch.long), sampling)
    probs = torch.where(torch.isfinite(probs), probs, 0.0)
    top = torch.topk(probs, min(n, int((probs > 0).sum())))
    return [(int(i), float(p)) for p, i in zip(top.values, top.indices)]


class ModelView:
    """One loaded model and its tokenizer, with its last result kept (one request at a time: the server locks)."""

    def __init__(self, model, tokenizer, name: str, run_dir: Path | None = None):
        self.model, self.tokenizer, self.name, self.run_dir = model.eval(), tokenizer, name, run_dir
        self.config = model.config
        self.n_layer, self.n_head = len(attention_modules(model)), self.config.n_head
        self.last: Result | None = None
        self.runs = 0  # forwards run, for tests: tokens unchanged and layers kept cost none

    def describe(self) -> dict:
        c = self.config
        return {"name": self.name, "n_layer": self.n_layer, "n_head": self.n_head, "n_embd": c.n_embd,
                "block_size": c.block_size, "vocab_size": self.tokenizer.vocab_size,
                "tokenizer": self.tokenizer.describe()}

    def encode(self, text: str) -> list[int]:
        """The text's ids; ValueError (one line) when it is empty, has unknown characters or exceeds the context."""
        if text == "":
            raise ValueError("the text is empty: type a prompt")
        try:
            ids = self.tokenizer.encode(text)
        except ValueError as e:  # a char model: characters outside its vocabulary (the message names them)
            raise ValueError(f"cannot encode the text: {e}") from None
        return self.check_ids(ids)

    def check_ids(self, ids: list[int]) -> list[int]:
        """`ids` when this model can run them; ValueError (one line) when it cannot."""
        if not ids:
            raise ValueError("the text is empty: type a prompt")
        if len(ids) > self.config.block_size:
            raise ValueError(f"the text is {len(ids)} tokens, longer than the model's context of "
                             f"{self.config.block_size}: shorten it")
        bad = [i for i in ids if not 0 <= i < self.tokenizer.vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary (0..{self.tokenizer.vocab_size - 1}): "
                             "send ids this model's tokenizer made")
        return ids

    def text_of(self, ids: list[int]) -> str | None:
        """The exact text of `ids`; None when their bytes are not whole UTF-8 characters (a character split
        between tokens, cut at the end), since no text holds them."""
        try:
            return self.tokenizer.decode_bytes(ids).decode("utf-8")
        except UnicodeDecodeError:
            return None

    def run(self, ids: list[int], layers: list[int]) -> Result:
        """The result for `ids` with at least `layers`; the model runs only for tokens or layers not kept."""
        if self.last is None or self.last.ids != ids:
            self.last = None
        missing = [l for l in dict.fromkeys(layers) if self.last is None or l not in self.last.weights]
        if self.last is None or missing:
            self.runs += 1
            new = forward_with_attention(self.model, ids, missing)
            new.logits = new.logits[: self.tokenizer.vocab_size]  # padded vocabulary rows: never a token
            check_finite(new)
            if self.last is not None:  # same tokens: keep the layers already there
                new.weights.update(self.last.weights)
                new.scores.update(self.last.scores)
            self.last = new
        return self.last

    def lens(self, ids: list[int], top: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The logit lens of `ids` (model/lens.py): (probabilities, ids), each (n_layer + 1, T, top)."""
        probs, top_ids, _ = top_of_lens(self.model, ids, top, self.tokenizer.vocab_size)
        if not torch.isfinite(probs).all():
            raise NonFiniteError("the model computed NaN or infinity in the logit lens: are its weights finite?")
        return probs.cpu(), top_ids.cpu()


STOCK_PROMPTS = ("ROMEO:\nBut soft, what light through yonder window breaks?", "ROMEO:")


def first_prompt(views: list) -> str:
    """The text the page starts with when none is given: model A's run's probe text (what its timeline shows), else
    a line of the Shakespeare the presets train on, the first that every model can take ("": none can)."""
    run = views[0].run_dir
    recorded = probes.steps(run) if run is not None else []
    probe = [probes.read_snapshot(run, recorded[0], tensors=False)["text"]] if recorded else []
    for text in (*probe, *STOCK_PROMPTS):
        try:
            for view in views:
                view.encode(text)
        except ValueError:
            continue
        return text
    return ""


def load_source(kind: str | None, path: str | None, device):
    """(model in eval mode on `device`, tokenizer, name, run dir) of --run DIR, --checkpoint FILE or --init HF_DIR
    (None: the newest run; no run dir), loaded as sample.py loads them; the one place the explorer loads models."""
    from checkpoint.file import load_model
    from checkpoint.locate import resolve_checkpoint
    if kind == "init":
        return (*load_model(hf_dir=path, device=device), str(path), None)
    ckpt = resolve_checkpoint(path if kind == "run" else None, path if kind == "checkpoint" else None)
    return (*load_model(ckpt, device=device), str(ckpt), Path(ckpt).parent)


def load_views(sources: list[tuple[str, str]], device) -> list:
    """A ModelView per source (the newest run when none); two models must share their tokenizer."""
    views = [ModelView(*load_source(kind, path, device)) for kind, path in (sources or [(None, None)])]
    if len(views) == 2 and views[0].tokenizer.to_dict() != views[1].tokenizer.to_dict():
        a, b = (v.tokenizer.describe() for v in views)
        raise ValueError(f"the two models use different tokenizers ({a} vs {b}), so their tokens and maps do not "
                         "line up: compare checkpoints trained with the same tokenizer")
    return views
