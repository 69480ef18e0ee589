"""One checkpoint file: a plain dict, written atomically, loaded with torch.load(weights_only=True), so loading
never unpickles code; every way a file can be unusable is one CheckpointError line. Keys: docs/design.md.
"""
from __future__ import annotations

import errno
import os
import re
import shutil
import warnings
from pathlib import Path
from pickle import UnpicklingError  # what torch.load(weights_only=True) raises on a refused object

import torch

from common.files import atomic_write, fsync_dir, remove_quietly, replace, temp_path

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
    """Atomically make `dst` hold the same bytes as `src` (hard link; copy where links are unsupported)."""
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
    stale = list(Path(run_dir).glob(".*.pt.*.tmp"))
    for p in stale:
        remove_quietly(p)
    return len(stale)


def _not_a_checkpoint(p: Path) -> CheckpointError:
    return CheckpointError(f"{p} is not a PyTorch checkpoint (unreadable pickle data): use a last.pt or best.pt "
                           f"written by train.py")


def load_checkpoint(path: str | os.PathLike, mmap: bool = False) -> dict:
    """Load (onto the CPU; `mmap`: tensors paged in on use) and check a tinygpt checkpoint file with
    torch.load(weights_only=True); CheckpointError if unusable. checkpoint.locate.read_checkpoint calls it."""
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
            ckpt = torch.load(p, map_location="cpu", weights_only=True, mmap=mmap)
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


def tokenizer_name(tok: dict) -> str:
    """Format 1's "tokenizer" entry in words for error lines: "gpt2 BPE", "char (65 characters)" or
    "own BPE (4096 tokens)"."""
    if tok.get("type") == "char":
        return f"char ({len(tok.get('chars', ''))} characters)"
    if tok.get("type") == "bpe":
        return f"own BPE ({tok.get('vocab_size')} tokens)"
    return "gpt2 BPE" if tok.get("type") == "gpt2" else str(tok.get("type", "unknown"))
