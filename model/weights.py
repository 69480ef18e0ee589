"""Weights into a model, whatever their source (checkpoint, Hugging Face, fine-tune): one check, one error line,
and a model built on the meta device that takes the tensors as they are."""
from __future__ import annotations

import re

import torch


def clean_state_dict(sd: dict) -> dict:
    """Strip the `_orig_mod.` / `module.` prefixes wrappers add to parameter names."""
    return {re.sub(r"^((_orig_mod|module)\.)+", "", k): v for k, v in sd.items()}


def check_weights(model: torch.nn.Module, state_dict: dict, source) -> dict:
    """`state_dict` without wrapper prefixes; a one-line ValueError when its names or shapes differ from `model`'s
    (a None value counts as missing). `source` names where the weights come from."""
    own, sd = model.state_dict(), clean_state_dict(state_dict)
    missing = [k for k in own if sd.get(k) is None]
    unexpected = [k for k in sd if k not in own]
    wrong = [k for k in own if sd.get(k) is not None and tuple(sd[k].shape) != tuple(own[k].shape)]
    parts = [f"missing {len(missing)} (e.g. {missing[0]})"] if missing else []
    parts += [f"unexpected {len(unexpected)} (e.g. {unexpected[0]})"] if unexpected else []
    parts += [f"{k} has shape {tuple(sd[k].shape)} there but {tuple(own[k].shape)} here" for k in wrong[:1]]
    if parts:
        raise ValueError(f"the weights in {source} do not match the model ({'; '.join(parts)}): use the model "
                         f"settings they were trained with")
    return sd


def model_with_weights(model_cls, config, state_dict: dict, source) -> torch.nn.Module:
    """`model_cls(config)` on the CPU holding `state_dict`'s tensors (float32), checked by check_weights."""
    with torch.device("meta"):  # shapes only: the state_dict provides every value
        model = model_cls(config)
    sd = {k: v.to(torch.float32) if v.is_floating_point() else v
          for k, v in check_weights(model, state_dict, source).items()}
    model.load_state_dict(sd, assign=True)
    if config.tie_weights:  # assign=True replaced the shared Parameter with two tensors: tie them again
        model.lm_head.weight = model.transformer.wte.weight
    return model
