"""A nanoGPT run as it is: its out_dir's ckpt.pt, read like every checkpoint (torch.load weights_only=True), becomes
the plain dict tinygpt's own checkpoints are, so sample, eval, explore, export and fine-tuning take it with no
conversion step. Its vocabulary is found as nanoGPT's sample.py finds it (meta.pkl, else GPT-2 BPE); meta.pkl is a
pickle, read by an unpickler that admits plain containers only and calls nothing. Errors are ValueError lines that
checkpoint.file raises as CheckpointError. docs/sampling.md, "From nanoGPT".
"""
from __future__ import annotations

import io
import json
import pickle
import sys
from pathlib import Path

CKPT = "ckpt.pt"  # nanoGPT's train.py writes out_dir/ckpt.pt
META = "meta.pkl"  # its char-level prepare.py writes data/<dataset>/meta.pkl: {vocab_size, itos, stoi}
MODEL_ARGS = ("n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size", "dropout")  # nanoGPT's GPTConfig
BUFFERS = (".attn.bias", ".attn.masked_bias")  # the causal-mask buffer of nanoGPT's attention without flash
GPT2_VOCAB = 50257


def is_nanogpt(ckpt) -> bool:
    """Does this torch.load'ed object look like nanoGPT's ckpt.pt (model weights and model_args, no tinygpt format)?"""
    return isinstance(ckpt, dict) and "format" not in ckpt and isinstance(ckpt.get("model_args"), dict) \
        and isinstance(ckpt.get("model"), dict)


def from_nanogpt(ckpt: dict, path: Path) -> dict:
    """nanoGPT's ckpt.pt (at `path`) as a tinygpt checkpoint dict: weights without the `_orig_mod.` prefix of a
    compiled run, a model_config computing what nanoGPT's model computes (exact GELU), its step and its vocabulary.
    The optimizer state is not carried over: a nanoGPT run continues as a fine-tune (model.init_from)."""
    from model.config import GPTConfig
    from model.gpt import clean_state_dict
    args = ckpt["model_args"]
    if missing := [k for k in MODEL_ARGS if args.get(k) is None]:
        raise ValueError(f"{path} has model_args without {', '.join(missing)}: it is not a checkpoint of "
                         f"nanoGPT's train.py; use nanoGPT's own out_dir/{CKPT} or a tinygpt checkpoint")
    if unknown := sorted(set(args) - set(MODEL_ARGS)):
        raise ValueError(f"{path} has model_args tinygpt does not know ({', '.join(map(str, unknown))}): a "
                         f"modified nanoGPT's model cannot be read; use a checkpoint of nanoGPT's own model.py")
    config = {**{k: args[k] for k in MODEL_ARGS}, "tie_weights": True, "mlp": "gelu_exact"}  # nanoGPT's nn.GELU()
    # each value checked by GPTConfig: what is wrong, without its advice (a file's model_args are
    # not settings)
    try:
        GPTConfig.from_dict(config)
    except ValueError as e:
        what = str(e).split(": ")[0]
        raise ValueError(f"{path} has model_args that nanoGPT's model.py cannot build either "
                         f"({what}): it was not written by nanoGPT's own train.py, or was edited "
                         f"since; use the out_dir/{CKPT} that train.py wrote") from None
    weights = {k: v for k, v in clean_state_dict(ckpt["model"]).items() if not k.endswith(BUFFERS)}
    check_weights(weights, config, path, saved=list(ckpt["model"]))
    tokenizer = vocabulary(path, ckpt.get("config"), config["vocab_size"])
    return {"format": "tinygpt", "version": 1, "model": weights, "model_config": config,
            "step": int(ckpt.get("iter_num") or 0), "tokenizer": tokenizer, "from_nanogpt": True}


def _expected(config: dict) -> dict:
    """Name -> shape of the tensors nanoGPT's model.py makes for these model_args (GPT-2's names,
    which are tinygpt's)."""
    import torch
    from model.config import GPTConfig
    from model.gpt import GPT
    with torch.device("meta"):
        model = GPT(GPTConfig.from_dict(config))
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def _shapes(weights: dict) -> dict:
    return {k: tuple(getattr(v, "shape", ())) for k, v in weights.items()}


def _fits(weights: dict, config: dict) -> bool:
    try:
        return _shapes(weights) == _expected(config)
    except ValueError:
        return False


def _edit(path: Path, change: str) -> str:
    """The command that makes `change` (Python on the loaded dict `c`) to the file at `path`."""
    from common.platform import command_line
    code = (f"import torch; p = {json.dumps(str(path))}; c = torch.load(p, weights_only=True); "
            f"{change}; torch.save(c, p)")
    return command_line(["python", "-c", code])


def check_weights(weights: dict, config: dict, path: Path, saved: list[str]) -> None:
    """The weights (wrapper prefixes gone) against what nanoGPT's model.py makes for the model_args:
    a ValueError line in nanoGPT's terms when they differ, with the edit of the file that makes them
    agree when one does (found by trying model_args read off the weights), else what to do. `saved`:
    the file's own names of the weights."""
    from common.cli import count
    from model.gpt import clean_state_dict
    expected, shapes = _expected(config), _shapes(weights)
    if shapes == expected:
        return
    nanogpt = "nanoGPT's own sample.py could not load it either"
    # model_args as the weights say: biases or none, the layers, the embeddings' sizes
    wte = shapes.get("transformer.wte.weight", ())
    wpe = shapes.get("transformer.wpe.weight", ())
    read = {"bias": any(k.endswith(".bias") for k in weights),
            "n_layer": len({k.split(".")[2] for k in weights if k.startswith("transformer.h.")})}
    if len(wte) == 2:
        read.update(vocab_size=wte[0], n_embd=wte[1])
    if len(wpe) == 2:
        read.update(block_size=wpe[0])
    changed = {k: v for k, v in read.items() if v != config[k]}
    if changed and _fits(weights, {**config, **changed}):
        said = ", ".join(f"{k}={config[k]}" for k in changed)
        held = ", ".join(f"{k}={v}" for k, v in changed.items())
        edit = "; ".join(f'c["model_args"]["{k}"] = {v!r}' for k, v in changed.items())
        raise ValueError(f"{path}'s model_args say {said} but its weights are those of a model "
                         f"with {held}, so {nanogpt}; if the weights are right, correct model_args "
                         f"in the file: {_edit(path, edit)}")
    extra = [k for k in weights if k not in expected]
    missing = [k for k in expected if k not in weights]
    wrong = [k for k in expected if k in weights and shapes[k] != expected[k]]
    if extra and not missing and not wrong:
        saved_as = clean_state_dict(dict(zip(saved, saved)))
        drop = "; ".join(f'del c["model"]["{saved_as[k]}"]' for k in extra)
        them = "them" if len(extra) > 1 else "it"
        raise ValueError(f"{path} holds {count(len(extra), 'tensor')} nanoGPT's model.py does not "
                         f"make ({', '.join(extra[:3])}): it was saved from a modified model.py, "
                         f"which tinygpt cannot run and {nanogpt}; sample it with the nanoGPT "
                         f"that trained it or, if the model does not need {them}, delete {them} "
                         f"from the file: {_edit(path, drop)}")
    # (extra tensors with missing or misshapen ones: the latter say more)
    args = ", ".join(f"{k}={config[k]}" for k in MODEL_ARGS[:6])
    if missing:
        what = f"lacks {missing[0]}, a tensor nanoGPT's model.py makes for its model_args ({args})"
    else:
        what = (f"has {wrong[0]} of shape {shapes[wrong[0]]} where nanoGPT's model.py makes "
                f"{expected[wrong[0]]} for its model_args ({args})")
    raise ValueError(f"{path} {what}: the file is incomplete or from a modified nanoGPT "
                     f"({nanogpt}); use the out_dir/{CKPT} that nanoGPT's own train.py wrote")


def meta_paths(path: Path, run_config) -> list[Path]:
    """Where the run's meta.pkl may be, in order: beside ckpt.pt, then data/<dataset>/ of the current directory
    (where nanoGPT's sample.py looks) and of the directory above the run (a nanoGPT checkout holding out_dir)."""
    dataset = run_config.get("dataset") if isinstance(run_config, dict) else None
    places = [path.parent / META]
    if isinstance(dataset, str) and dataset:
        places += [Path("data") / dataset / META, path.parent.parent / "data" / dataset / META]
    return list(dict.fromkeys(places))


def vocabulary(path: Path, run_config, vocab_size: int) -> dict:
    """The tokenizer description (data.tokenizer's to_dict()) of the nanoGPT run at `path`: its meta.pkl's
    characters, else GPT-2 BPE as in nanoGPT; one ValueError line when it cannot fit the weights."""
    found = next((p for p in meta_paths(path, run_config) if p.is_file()), None)
    if found is None:
        if vocab_size < GPT2_VOCAB:
            looked = ", ".join(str(p) for p in meta_paths(path, run_config))
            raise ValueError(f"{path} has {vocab_size} token rows and no {META} was found (looked at {looked}): "
                                  f"copy the run's data/<dataset>/{META} beside {CKPT}")
        print(f"no {META} found: {path} reads GPT-2 BPE, as nanoGPT's sample.py does", file=sys.stderr)
        return {"type": "gpt2"}
    chars = read_meta(found)
    if len(chars) != vocab_size:
        raise ValueError(f"{found} holds {len(chars)} characters but {path} has {vocab_size} token rows: it is "
                              f"another run's vocabulary; put this run's {META} beside {CKPT}")
    print(f"vocabulary from {found}", file=sys.stderr)
    return {"type": "char", "chars": chars}


class _PlainUnpickler(pickle.Unpickler):
    """Dicts, lists, tuples, strings and numbers only: every global (a class, a function) is refused."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"global {module}.{name}")


def read_meta(path: Path) -> str:
    """The characters of nanoGPT's meta.pkl, ids in order; a ValueError line for anything else."""
    not_meta = f"{path} is not a nanoGPT vocabulary (meta.pkl of a char-level prepare.py, {{vocab_size, itos, stoi}})"
    try:
        meta = _PlainUnpickler(io.BytesIO(path.read_bytes())).load()
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror or e}: check its permissions") from None
    except Exception as e:  # noqa: BLE001 - a refused global, truncated or foreign bytes: not a vocabulary
        raise ValueError(f"{not_meta}: {type(e).__name__} {str(e)[:80]}; remove it or use the run's own") from None
    itos = meta.get("itos") if isinstance(meta, dict) else None
    if not isinstance(itos, dict) or sorted(itos) != list(range(len(itos))) or not itos:
        raise ValueError(f"{not_meta}: it has no itos table of ids 0..n-1")
    chars = [itos[i] for i in range(len(itos))]
    if not all(isinstance(c, str) and len(c) == 1 for c in chars) or len(set(chars)) != len(chars):
        raise ValueError(f"{not_meta}: its itos entries must be distinct single characters")
    if chars != sorted(chars):  # prepare.py sorts them; tinygpt's char vocabulary is the sorted characters too
        raise ValueError(f"{path}'s characters are not in sorted order, as nanoGPT's prepare.py writes them: "
                              f"tinygpt's char vocabulary cannot hold this order")
    return "".join(chars)
