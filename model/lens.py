"""The logit lens (nostalgebraist's; TransformerLens and nnsight compute it in notebooks): what each
layer would predict if the model stopped there, its residual stream through the final norm and head
(and softcap). Read from one run of the model's own forward: hooks keep the embedding's and each
block's output and hand the final norm all of them stacked, so the last row is the model's output,
every setting computes as the model does, and the lens runs wherever the forward does (FSDP too). It
holds (n_layer + 1) x T x vocab logits at once.
"""
from __future__ import annotations

import sys
from contextlib import nullcontext

import torch


@torch.no_grad()
def logit_lens(model, idx: torch.Tensor, attention: bool = False) -> tuple[torch.Tensor,
                                                                           torch.Tensor | None]:
    """idx (B, T) -> (logits (n_layer + 1, B, T, V): row 0 after the embedding, row l after block l;
    with `attention`, the softmax weights (n_layer, B, n_head, T, T) of the same forward, else
    None). Dropout off."""
    t, stream, weights = model.transformer, [], []

    def keep(module, args, out):  # dropout's output is the embedding; a block's is (x, weights)
        stream.append(out[0] if isinstance(out, tuple) else out)

    def stacked(module, args):
        assert len(stream) == len(t.h) + 1 and stream[-1] is args[0], \
            "every block's output reaches the final norm"
        return (torch.cat(stream),)  # ((n_layer + 1) B, T, C)

    hooks = [t.drop.register_forward_hook(keep),
             *(block.register_forward_hook(keep) for block in t.h),
             t.ln_f.register_forward_pre_hook(stacked)]
    # the attention modules' manual path, asked for its weights
    for block in t.h if attention else []:
        hooks += [block.attn.register_forward_pre_hook(lambda m, a,
                                                       kw: (a, {**kw, "need_weights": True}),
                                                       with_kwargs=True),
                  block.attn.register_forward_hook(lambda m, a, out: weights.append(out[1]))]
    # compiled regions (training's) would recompile for every
    # new hook: the forward runs as the model's Python instead
    compiled = "torch._dynamo" in sys.modules
    plain = torch.compiler.set_stance("force_eager") if compiled else nullcontext()
    was_training = model.training
    model.eval()
    try:
        with plain:
            logits, _ = model(idx)
    finally:
        model.train(was_training)
        for h in hooks:
            h.remove()
    return logits.view(len(stream), *idx.shape, -1), torch.stack(weights) if attention else None


def top_tokens(logits: torch.Tensor, k: int, vocab_size: int | None = None) -> tuple[torch.Tensor,
                                                                                     torch.Tensor]:
    """(probabilities, ids), each (..., k): the k likeliest tokens of softmax(logits) over the first
    `vocab_size` ids (the padded ones are no tokens), a row at a time so that only one row's
    probabilities are held."""
    rows = [torch.topk(row[..., :vocab_size].float().softmax(-1), k) for row in logits]
    return torch.stack([r.values for r in rows]), torch.stack([r.indices for r in rows])


def top_of_lens(model, ids: list[int], k: int, vocab_size: int, attention: bool = False):
    """One text's logit lens as its top `k` (probabilities, ids), each (n_layer + 1, T, k), and with
    `attention` the same forward's weights (n_layer, n_head, T, T), else None: what the explorer and
    the probe snapshots show."""
    logits, weights = logit_lens(model, torch.tensor([ids], device=next(model.parameters()).device),
                                 attention)
    probs, top = top_tokens(logits[:, 0], k, vocab_size)
    return probs, top, weights[:, 0] if attention else None
