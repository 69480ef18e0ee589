"""One checkpoint file: a plain dict, written atomically, loaded with torch.load(weights_only=True).

Plain containers only, so loading never unpickles code; every way a file can be unusable becomes one
CheckpointError line. Format 1's keys are listed in docs/design.md (Checkpoints).
"""
from __future__ import annotations

import errno
import os
import random
import re
import shutil
import warnings
from pathlib import Path
from pickle import UnpicklingError  # what torch.load(weights_only=True) raises on a refused object
from typing import Any

import numpy as np
import torch

from common.files import atomic_write, fsync_dir, remove_quietly, temp_path

FORMAT = "tinygpt"
VERSION = 1
REQUIRED_KEYS = ("model", "model_config", "step")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message is one line saying what is wrong and what to do."""


def _disk_full(e: BaseException, directory: Path | None = None) -> bool:
    """ENOSPC in the exception chain or, given the directory (torch's zip writer can report a full disk as
    "unexpected pos ..." only), no room left there: asked before the partial temp file is removed."""
    while e is not None:
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            return True
        e = e.__cause__ or e.__context__
    if directory is None:
        return False
    try:
        return shutil.disk_usage(directory).free < 16 << 20
    except OSError:
        return False


def _save_error(path: Path, e: BaseException, full: bool = False) -> OSError:
    if full or _disk_full(e):
        err = OSError(f"could not write checkpoint {path}: no space left on device (the previous {path.name}, if "
                      f"any, is intact): free some disk space and resume with train.resume=true, or resume on another "
                      f"disk with hydra.run.dir=<a directory there> train.resume={path.parent}")
        err.errno = errno.ENOSPC
        return err
    reason = e.strerror if isinstance(e, OSError) and e.strerror else (str(e).splitlines() or [type(e).__name__])[0]
    err = OSError(f"could not write checkpoint {path}: {reason} (the previous {path.name}, if any, is intact; "
                  f"free some disk space or fix the directory's permissions, then resume)")
    err.errno = getattr(e, "errno", None) or 0  # set afterwards: OSError(errno, msg) would print "[Errno N] msg"
    return err


def save_checkpoint(obj: dict, path: str | os.PathLike) -> Path:
    """Write `obj` to `path` atomically (common.files.atomic_write); a failure is one OSError line."""
    path, full = Path(path), False
    try:
        with atomic_write(path) as f:
            try:
                torch.save(obj, f)
            except RuntimeError as e:  # torch's zip writer, on a full disk too
                full = _disk_full(e, path.parent)
                raise
    except (OSError, RuntimeError) as e:
        raise _save_error(path, e, full) from None
    return path


def link_checkpoint(src: str | os.PathLike, dst: str | os.PathLike) -> Path:
    """Atomically make `dst` hold the same bytes as `src` (hard link; copy where links are unsupported). A hard
    link shares the inode, so when `src` is later replaced by os.replace, `dst` keeps the old bytes."""
    src, dst = Path(src), Path(dst)
    tmp = temp_path(dst)
    try:
        try:
            os.link(src, tmp)
        except OSError:  # a filesystem without hard links: copy
            with open(src, "rb") as fi, atomic_write(dst) as fo:
                shutil.copyfileobj(fi, fo, 1 << 20)
            return dst
        os.replace(tmp, dst)
    except OSError as e:
        raise _save_error(dst, e) from None
    finally:
        remove_quietly(tmp)  # gone already unless something failed
    fsync_dir(dst.parent)
    return dst


def remove_stale_temp_files(run_dir: str | os.PathLike) -> int:
    """Delete temp files a killed save left behind (`.last.pt.<pid>.<id>.tmp`); returns how many."""
    stale = list(Path(run_dir).glob(".*.pt.*.tmp"))
    for p in stale:
        remove_quietly(p)
    return len(stale)


def _not_a_checkpoint(p: Path) -> CheckpointError:
    return CheckpointError(f"{p} is not a PyTorch checkpoint (unreadable pickle data): use a last.pt or best.pt "
                           f"written by train.py")


def load_checkpoint(path: str | os.PathLike, map_location: Any = "cpu") -> dict:
    """Load and check a tinygpt checkpoint with torch.load(weights_only=True); CheckpointError if unusable."""
    p = Path(os.path.expanduser(str(path)))
    if not p.exists():
        raise CheckpointError(f"checkpoint {p} does not exist: check the path (a run directory holds last.pt "
                              f"and best.pt)")
    if p.is_dir():
        raise CheckpointError(f"{p} is a directory, not a checkpoint file: give {p / 'last.pt'} or {p / 'best.pt'}")
    if p.stat().st_size == 0:
        raise CheckpointError(f"checkpoint {p} is empty (0 bytes; an interrupted copy?): use another checkpoint, "
                              f"e.g. best.pt, or train again")
    try:
        with warnings.catch_warnings():  # torch warns about pickle protocols of files it is about to refuse
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            ckpt = torch.load(p, map_location=map_location, weights_only=True)
    except UnpicklingError as e:
        msg = str(e)
        m = re.search(r"GLOBAL ([\w.]+)", msg)
        if m or "Unsupported global" in msg:
            what = f" ({m.group(1)})" if m else ""
            raise CheckpointError(f"checkpoint {p} contains a pickled Python object{what}, which tinygpt refuses to "
                                  f"load (torch.load weights_only=True, for safety): use a checkpoint written by "
                                  f"tinygpt's train.py") from None
        raise _not_a_checkpoint(p) from None
    except EOFError:
        raise CheckpointError(f"checkpoint {p} is truncated (unexpected end of file): use another checkpoint, "
                              f"e.g. best.pt, or train again") from None
    except RuntimeError as e:
        msg = str(e)
        if "zip archive" in msg or "central directory" in msg or "PytorchStreamReader" in msg:
            raise CheckpointError(f"checkpoint {p} is truncated or corrupt (its zip archive is incomplete): use "
                                  f"another checkpoint, e.g. best.pt, or train again") from None
        raise CheckpointError(f"checkpoint {p} could not be read ({msg.splitlines()[0] if msg else 'RuntimeError'}): "
                              f"use a last.pt or best.pt written by train.py") from None
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EPERM, errno.ENOENT, errno.EISDIR, errno.EIO):
            raise CheckpointError(f"cannot read checkpoint {p}: {e.strerror or e}: check the path and its "
                                  f"permissions") from None
        # torch seeks to offsets a truncated archive does not have -> EINVAL
        raise CheckpointError(f"checkpoint {p} is truncated or corrupt ({e.strerror or e}): use another "
                              f"checkpoint, e.g. best.pt, or train again") from None
    except Exception:  # noqa: BLE001 - torch reads non-zip bytes as pickle; garbage raises KeyError, IndexError, ...
        raise _not_a_checkpoint(p) from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise CheckpointError(f"{p} is a PyTorch file but not a tinygpt checkpoint (no format='tinygpt' key): "
                              f"use a last.pt or best.pt written by train.py")
    version = ckpt.get("version")
    if not isinstance(version, int) or version < 1:
        raise CheckpointError(f"checkpoint {p} has an invalid format version {version!r}: it is corrupt; use "
                              f"another checkpoint")
    if version > VERSION:
        raise CheckpointError(f"checkpoint {p} was written by a newer tinygpt (format version {version}; this one "
                              f"reads up to {VERSION}): upgrade tinygpt")
    missing = [k for k in REQUIRED_KEYS if k not in ckpt]
    if missing:
        raise CheckpointError(f"checkpoint {p} lacks {', '.join(missing)}: it is incomplete; use another "
                              f"checkpoint")
    return ckpt


def clean_state_dict(sd: dict) -> dict:
    """Strip the `_orig_mod.` / `module.` prefixes wrappers add to parameter names."""
    out = {}
    for k, v in sd.items():
        while k.startswith(("_orig_mod.", "module.")):
            k = k.split(".", 1)[1]
        out[k] = v
    return out


def check_model_weights(model: torch.nn.Module, state_dict: dict, source: str = "the checkpoint") -> dict:
    """`state_dict` without wrapper prefixes; a one-line ValueError when its names or shapes differ from `model`'s."""
    own = model.state_dict()
    sd = clean_state_dict(state_dict)
    missing = [k for k in own if k not in sd]
    unexpected = [k for k in sd if k not in own]
    if missing or unexpected:
        parts = [f"missing {len(missing)} (e.g. {missing[0]})"] if missing else []
        parts += [f"unexpected {len(unexpected)} (e.g. {unexpected[0]})"] if unexpected else []
        raise ValueError(f"the weights in {source} do not match the model ({'; '.join(parts)}): use the model "
                         f"settings the checkpoint was trained with")
    for k, v in own.items():
        if tuple(sd[k].shape) != tuple(v.shape):
            raise ValueError(f"the weights in {source} do not match the model: {k} has shape {tuple(sd[k].shape)} "
                             f"there but {tuple(v.shape)} here: use the model settings the checkpoint was trained with")
    return sd


def tokenizer_name(tok: dict) -> str:
    """A checkpoint's "tokenizer" entry in words, for error lines: "gpt2 BPE" or "char (65 characters)"."""
    if tok.get("type") == "char":
        return f"char ({len(tok.get('chars', ''))} characters)"
    return "gpt2 BPE" if tok.get("type") == "gpt2" else str(tok.get("type", "unknown"))


def load_model_weights(model: torch.nn.Module, state_dict: dict, source: str = "the checkpoint") -> None:
    """load_state_dict(strict) with a one-line ValueError when names or shapes differ."""
    model.load_state_dict(check_model_weights(model, state_dict, source), strict=True)


def model_from_checkpoint(ckpt: dict):
    """Rebuild the GPT a checkpoint describes (on CPU, in eval mode); ValueError if the weights do not fit."""
    from model import GPT, GPTConfig
    model = GPT(GPTConfig.from_dict(dict(ckpt["model_config"])))
    load_model_weights(model, ckpt["model"])
    return model.eval()


def capture_rng_state() -> dict:
    """Every RNG that can influence training, as plain containers (weights_only-loadable)."""
    version, internal, gauss = random.getstate()
    np_state = np.random.get_state()
    return {
        "python": {"version": version, "state": list(internal), "gauss": gauss},
        "numpy": {"bit_generator": np_state[0], "keys": torch.from_numpy(np_state[1].astype(np.int64)),
                  "pos": int(np_state[2]), "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None,
    }


def restore_rng_state(state: dict) -> None:
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss"]))
    n = state["numpy"]
    np.random.set_state((n["bit_generator"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    torch.set_rng_state(state["torch"].cpu())
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        # a different GPU count restores what lines up (exactness is only promised on the same setup)
        for i, s in enumerate(cuda[:torch.cuda.device_count()]):
            torch.cuda.set_rng_state(s.cpu(), i)


_PLAIN = (torch.Tensor, int, float, str, bool, type(None))


def find_non_plain(obj: Any, where: str = "checkpoint") -> str | None:
    """Path of the first value that is not a plain container (None when all are plain). For tests/asserts."""
    if isinstance(obj, _PLAIN):
        return None
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, (list, tuple)):
        items = enumerate(obj)
    else:
        return f"{where} (a {type(obj).__name__})"
    for k, v in items:
        if not isinstance(k, (str, int)):
            return f"{where}[{k!r}] (key of type {type(k).__name__})"
        bad = find_non_plain(v, f"{where}[{k!r}]")
        if bad:
            return bad
    return None
