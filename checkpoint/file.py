"""One checkpoint file, written atomically, read with torch.load(weights_only=True) (a plain dict, format 1:
docs/design.md), and a run directory's (best.pt, else last.pt); every unusable file is one CheckpointError line. torch
is imported only to read or write, so sample.py checks its arguments first. Which one a command means: locate.py."""
from __future__ import annotations

import errno
import os
import re
import shutil
import warnings
from pathlib import Path
from pickle import UnpicklingError  # what torch.load(weights_only=True) raises on a refused object

FORMAT = "tinygpt"
VERSION = 1
REQUIRED_KEYS = ("model", "model_config", "step")
CHECKPOINT_NAMES = ("best.pt", "last.pt")     # in order of preference
DCP_META = "tinygpt.json"  # the metadata inside a sharded checkpoint directory (checkpoint/meta.py)
OLD_DCP_META = "tinygpt.pt"  # its torch.save form before 2026-11-27, still read
LAST_DCP = "last_dcp"
BEST_DCP = "best_dcp"
HF_CONFIG = "config.json"  # what makes a directory a Hugging Face model directory
NOT_A_CHECKPOINT = "{} is not a PyTorch checkpoint (unreadable pickle data): {}"
WRITTEN_BY_TRAIN = "use a last.pt or best.pt written by train.py"
CORRUPT = "checkpoint {} is truncated or corrupt ({}): {}, or train again"


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message is one line saying what is wrong and what to do."""


def _disk_full(e: BaseException, directory: Path | None = None) -> bool:
    """ENOSPC in the exception chain or, given the directory (torch's zip writer can report a full disk as
    "unexpected pos ..." only), no room left there: asked before the partial temp file is removed."""
    while e is not None:
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            return True
        e = e.__cause__ or e.__context__
    try:
        return directory is not None and shutil.disk_usage(directory).free < 16 << 20
    except OSError:
        return False


def _save_error(path: Path, e: BaseException, full: bool = False) -> OSError:
    full = full or _disk_full(e)
    reason = "no space left on device" if full else e.strerror if isinstance(e, OSError) and e.strerror else \
        (str(e).splitlines() or [type(e).__name__])[0]
    fix = (f"free some disk space and resume with train.resume=true, or resume on another disk with "
           f"hydra.run.dir=<a directory there> train.resume={path.parent}") if full else \
        "free some disk space or fix the directory's permissions, then resume"
    err = OSError(f"could not write checkpoint {path}: {reason} (the previous {path.name}, if any, is intact): {fix}")
    err.errno = errno.ENOSPC if full else getattr(e, "errno", None) or 0  # (OSError(errno, msg) prints "[Errno N]")
    return err


def save_checkpoint(obj: dict, path: str | os.PathLike) -> Path:
    """Write `obj` to `path` atomically (common.files.atomic_write); a failure is one OSError line."""
    import torch
    from common.files import atomic_write
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
    """Atomically make `dst` hold the same bytes as `src` (hard link; copy where links are unsupported)."""
    from common.files import atomic_write, fsync_dir, remove_quietly, replace, temp_path
    src, dst = Path(src), Path(dst)
    tmp = temp_path(dst)
    try:
        try:
            os.link(src, tmp)
        except OSError:  # a filesystem without hard links: copy
            with open(src, "rb") as fi, atomic_write(dst) as fo:
                shutil.copyfileobj(fi, fo, 1 << 20)
            return dst
        replace(tmp, dst)
    except OSError as e:
        raise _save_error(dst, e) from None
    finally:
        remove_quietly(tmp)  # gone already unless something failed
    fsync_dir(dst.parent)
    return dst


def remove_stale_temp_files(run_dir: str | os.PathLike) -> int:
    """Delete temp files a killed save left behind (`.last.pt.<pid>.<id>.tmp`); returns how many."""
    from common.files import remove_quietly
    stale = list(Path(run_dir).glob(".*.pt.*.tmp"))
    for p in stale:
        remove_quietly(p)
    return len(stale)


def load_checkpoint(path: str | os.PathLike, mmap: bool = False) -> dict:
    """Load (onto the CPU; `mmap`: tensors paged in on use) and check a checkpoint file; CheckpointError if unusable."""
    import torch
    p = Path(os.path.expanduser(str(path)))
    if not p.exists():
        raise CheckpointError(f"checkpoint {p} does not exist: check the path (a run directory holds last.pt "
                              f"and best.pt)")
    if p.is_dir():
        raise CheckpointError(f"{p} is a directory, not a checkpoint file: give {p / 'last.pt'} or {p / 'best.pt'}")
    if p.stat().st_size == 0:
        raise CheckpointError(f"checkpoint {p} is empty (0 bytes; an interrupted copy?): {instead(p)}, or train again")
    try:
        if p.name == DCP_META:  # a sharded checkpoint's metadata (JSON; ValueError: not what tinygpt writes)
            from checkpoint.meta import read_meta
            ckpt = read_meta(p)
        else:
            with warnings.catch_warnings():  # torch warns about pickle protocols of files it is about to refuse
                warnings.filterwarnings("ignore", message="Detected pickle protocol")
                ckpt = torch.load(p, map_location="cpu", weights_only=True, mmap=mmap)
    except UnpicklingError as e:
        if (m := re.search(r"GLOBAL ([\w.]+)", str(e))) or "Unsupported global" in str(e):
            raise CheckpointError(f"checkpoint {p} contains a pickled Python object{f' ({m[1]})' if m else ''}, "
                                  f"which tinygpt refuses to load (torch.load weights_only=True, for safety): use a "
                                  f"checkpoint written by tinygpt's train.py") from None
        raise CheckpointError(NOT_A_CHECKPOINT.format(p, instead(p, WRITTEN_BY_TRAIN))) from None
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EPERM, errno.ENOENT, errno.EISDIR, errno.EIO):
            raise CheckpointError(f"cannot read checkpoint {p}: {e.strerror or e}: check the path and its "
                                  f"permissions") from None
        raise CheckpointError(CORRUPT.format(p, e.strerror or e, instead(p))) from None  # EINVAL: seek past the end
    except (EOFError, RuntimeError) as e:
        msg = str(e) or type(e).__name__
        if isinstance(e, EOFError) or any(s in msg for s in ("zip archive", "central directory", "PytorchStream")):
            raise CheckpointError(CORRUPT.format(p, "unexpected end of file or incomplete zip archive",
                                                 instead(p))) from None
        raise CheckpointError(f"checkpoint {p} could not be read ({msg.splitlines()[0]}): {WRITTEN_BY_TRAIN}") from None
    except Exception as e:  # noqa: BLE001 - torch reads non-zip bytes as pickle; garbage raises KeyError, IndexError..
        raise CheckpointError(CORRUPT.format(p, e, instead(p)) if p.name == DCP_META else
                              NOT_A_CHECKPOINT.format(p, instead(p, WRITTEN_BY_TRAIN))) from None
    if isinstance(ckpt, dict) and "format" not in ckpt:  # nanoGPT's out_dir/ckpt.pt? (tinygpt's never import it)
        from checkpoint import nanogpt
        if nanogpt.is_nanogpt(ckpt):
            try:
                return nanogpt.from_nanogpt(ckpt, p)
            except ValueError as e:
                raise CheckpointError(str(e)) from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise CheckpointError(f"{p} is a PyTorch file but not a tinygpt checkpoint (no format='tinygpt' key) nor "
                              f"nanoGPT's ckpt.pt (no model and model_args): {WRITTEN_BY_TRAIN}")
    version = ckpt.get("version")
    if not isinstance(version, int) or version < 1:
        raise CheckpointError(f"checkpoint {p} has an invalid format version {version!r}: it is corrupt; {instead(p)}")
    if version > VERSION:
        raise CheckpointError(f"checkpoint {p} was written by a newer tinygpt (format version {version}; this one "
                              f"reads up to {VERSION}): upgrade tinygpt")
    missing = [k for k in REQUIRED_KEYS if k not in ckpt]
    if missing:
        raise CheckpointError(f"checkpoint {p} lacks {', '.join(missing)}: it is incomplete; {instead(p)}")
    return ckpt


def instead(path: str | os.PathLike, default: str = "use another checkpoint") -> str:
    """What to use when the checkpoint `path` cannot be: the run's other one beside it (best.pt for last.pt and
    back; not a hard link of it) when that one reads, never `path` itself; else `default`."""
    import torch
    p = Path(path)
    for other in (p.parent / name for name in CHECKPOINT_NAMES if name != p.name):
        try:
            ckpt = None if other.samefile(p) else torch.load(other, map_location="cpu", weights_only=True, mmap=True)
        except Exception:  # noqa: BLE001 - missing, unreadable: any reason it cannot be used
            continue
        if isinstance(ckpt, dict) and ckpt.get("format") == FORMAT and all(k in ckpt for k in REQUIRED_KEYS):
            return f"use {other} beside it instead"
    return default


def sharded_meta(path: str | os.PathLike) -> Path | None:
    """The metadata file of the sharded checkpoint directory `path`; None if `path` is not one."""
    p = Path(path)
    return next((p / n for n in (DCP_META, OLD_DCP_META) if (p / ".metadata").is_file() and (p / n).is_file()), None)


def is_sharded_checkpoint(path: str | os.PathLike) -> bool:
    return sharded_meta(path) is not None


def read_checkpoint(path: str | os.PathLike, *, model: bool = False, run_dir: bool = False,
                    mmap: bool = False) -> tuple[Path, dict]:
    """(its path, the checkpoint) that `path` names, checked: a file, or a sharded directory's metadata unless
    `model` (then weights and a tokenizer are required); `run_dir`: a run directory's best.pt, else last.pt."""
    p = Path(os.path.expanduser(str(path)))
    if run_dir and p.is_dir():
        p = checkpoint_in_run(p)
    ckpt = load_checkpoint((not model and sharded_meta(p)) or p, mmap=mmap)
    if model and ckpt.get("model") is None:
        raise CheckpointError(f"checkpoint {p} holds no model weights (a sharded checkpoint's metadata?): use the "
                              "run's last.pt or best.pt")
    if model and not isinstance(ckpt.get("tokenizer"), dict):
        raise CheckpointError(f"checkpoint {p} has no tokenizer: it was not written by train.py; use a last.pt or "
                              "best.pt from a training run")
    return p, ckpt


def batch_tokens(ckpt: dict) -> int | None:
    """The global batch a checkpoint was trained with (its config x its process count), if it says."""
    t = (ckpt.get("config") or {}).get("train") or {}
    sizes = (t.get("batch_size"), t.get("grad_accum_steps"), (ckpt.get("model_config") or {}).get("block_size"))
    if all(isinstance(v, int) for v in sizes):
        return sizes[0] * sizes[1] * sizes[2] * len(ckpt.get("rng_ranks") or [None])
    return None


def checkpoint_in_run(run_dir, other: str | None = None) -> Path:
    """best.pt, else last.pt, of a run directory; FileNotFoundError (one line) when it has neither, which says
    so when it is a Hugging Face directory: use `other` (the CLI's option for those, e.g. "--init HF_DIR")."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run directory {run_dir} does not exist: pass a directory containing best.pt "
                                "or last.pt")
    for name in CHECKPOINT_NAMES:
        if (run_dir / name).is_file():
            return run_dir / name
    from checkpoint.nanogpt import CKPT
    if (run_dir / CKPT).is_file():  # a nanoGPT out_dir
        return run_dir / CKPT
    if (run_dir / HF_CONFIG).is_file():
        use = f"use {other.split()[0]} {run_dir}" if other else "pass a training run's directory"
        raise FileNotFoundError(f"run directory {run_dir} is a Hugging Face directory ({HF_CONFIG}, no best.pt or "
                                f"last.pt), not a training run: {use}")
    raise FileNotFoundError(f"run directory {run_dir} has no best.pt or last.pt: has its training saved a "
                            "checkpoint yet? (or pass --checkpoint FILE; a nanoGPT out_dir holds ckpt.pt)")


def model_from_checkpoint(ckpt: dict, source="the checkpoint"):
    """The GPT a checkpoint describes (on CPU, float32, in eval mode); ValueError if the weights do not fit."""
    from model.config import GPTConfig
    from model.gpt import GPT, model_with_weights
    return model_with_weights(GPT, GPTConfig.from_dict(dict(ckpt["model_config"])), ckpt["model"], source).eval()


def load_for_inference(path, device="cpu"):
    """(float32 eval-mode model on `device`, tokenizer dict, checkpoint dict) of a checkpoint file (FSDP runs' too)."""
    _, ckpt = read_checkpoint(path, model=True)
    # a model_config that cannot be built, or weights that do not fit it: the file disagrees with
    # itself, which no setting mends (GPTConfig's and check_weights' advice is for a run's
    # settings): what is wrong, and another file
    try:
        model = model_from_checkpoint(ckpt)
    except ValueError as e:
        what = str(e).split(": ")[0]
        raise CheckpointError(f"checkpoint {path} cannot be built as it describes itself ({what}): "
                              f"it is damaged or was edited; {instead(path)}") from None
    return model.to(device), ckpt["tokenizer"], ckpt


def load_model(checkpoint=None, hf_dir=None, device="cpu"):
    """(float32 eval-mode model on `device`, tokenizer) of a checkpoint file, or of a local Hugging Face directory
    (config.json + weights, and its tokenizer files): how sample.py, eval.py and the explorer load a model."""
    if hf_dir is not None:
        from data.hf_tokenizer import read_hf_tokenizer
        from model.gpt import GPT
        model, tokenizer = GPT.from_pretrained(hf_dir), read_hf_tokenizer(hf_dir)
    else:
        from data.tokenizer import tokenizer_from_dict
        model, tok, _ = load_for_inference(checkpoint)
        tokenizer = tokenizer_from_dict(tok)
    check_vocab(tokenizer.vocab_size, model)
    return model.to(device), tokenizer


def check_vocab(tokenizer_vocab_size: int, model) -> None:
    """ValueError unless the model has a row for every token (more rows are padding: fine)."""
    if tokenizer_vocab_size > model.config.vocab_size:
        raise ValueError(f"the tokenizer has {tokenizer_vocab_size} tokens but the model only "
                         f"{model.config.vocab_size}: model and tokenizer do not belong together")
