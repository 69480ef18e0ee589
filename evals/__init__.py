"""Scoring text with a model as lm-evaluation-harness does: eval.py (--file, --hellaswag) and evals/hellaswag.py."""


def logprobs(logits, targets):
    """log-probabilities of `targets` under `logits` (float32 log_softmax over the vocabulary, the last dimension,
    then gather: lm-eval's computation), as float64 on the CPU; 0 where a target is -1 (not scored)."""
    import torch
    logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, targets.clamp(min=0)[..., None])[..., 0]
    return torch.where(targets >= 0, logp, 0.0).cpu().double()
