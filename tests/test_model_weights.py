"""model/weights.py: one check and one wording for weights that do not fit, and the meta-device build."""
from __future__ import annotations

import pytest
import torch

from model import GPT, GPTConfig
from model.gpt import check_weights, clean_state_dict, model_with_weights


def _model(**kw):
    torch.manual_seed(0)
    return GPT(GPTConfig(**{**dict(vocab_size=32, block_size=16, n_layer=2, n_head=2, n_embd=32), **kw}))


def test_mismatches_are_one_line_in_one_wording():
    sd = _model().state_dict()
    for other, says in ((_model(n_layer=3), r"missing 12 \(e\.g\. transformer\.h\.2\."),
                        (_model(n_layer=1), r"unexpected 12 \(e\.g\. transformer\.h\.1\."),
                        (_model(n_embd=64), r"transformer\.wte\.weight has shape \(32, 32\) there but \(32, 64\) here")):
        with pytest.raises(ValueError, match=rf"^the weights in src\.pt do not match the model \({says}.*\): use the "
                                             r"model settings they were trained with$") as info:
            check_weights(other, sd, "src.pt")
        assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match=r"missing 1 \(e\.g\. lm_head\.weight\)"):  # a None value is missing
        check_weights(_model(), {**sd, "lm_head.weight": None}, "x")


def test_wrapper_prefixes_are_stripped():
    sd = {"_orig_mod.module.a": 1, "module.b": 2, "c": 3}
    assert clean_state_dict(sd) == {"a": 1, "b": 2, "c": 3}


@pytest.mark.parametrize("tie", [True, False])
def test_model_with_weights_takes_the_tensors_as_they_are(tie):
    src = _model(tie_weights=tie)
    sd = {f"_orig_mod.{k}": v for k, v in src.state_dict().items()}
    model = model_with_weights(GPT, src.config, sd, "src")
    assert model.transformer.wte.weight.data_ptr() == src.transformer.wte.weight.data_ptr()  # no copy
    assert (model.lm_head.weight is model.transformer.wte.weight) == tie  # tied again after assign
    x = torch.randint(0, 32, (2, 8))
    assert torch.equal(model.eval()(x)[0], src.eval()(x)[0])
    half = model_with_weights(GPT, src.config, {k: v.half() for k, v in src.state_dict().items()}, "src")
    assert {p.dtype for p in half.parameters()} == {torch.float32}  # a float32 model, like a fresh one
