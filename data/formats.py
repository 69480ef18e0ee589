"""What kind of file a source is: the one table of the formats read (a file alone and a directory's files alike),
and the look at a file's first bytes that tells a compressed archive or a binary file from text, so that such a
file is named for what it is (decompress it) instead of failing as text that is not UTF-8.
"""
from __future__ import annotations

from pathlib import Path

from common.cli import setting_error
from common.platform import command_line

# suffix -> how its text is read (data/corpus.py's readers; "columnar": data/columnar.py). A file alone of another
# suffix is read as plain text; a directory contributes the files of these suffixes only.
FORMATS = {".txt": "text", ".jsonl": "jsonl", ".json": "json", ".csv": "csv", ".parquet": "columnar",
           ".arrow": "columnar"}
COLUMNAR = tuple(s for s, kind in FORMATS.items() if kind == "columnar")  # parquet, and `datasets` Arrow files
KEYED = tuple(s for s, kind in FORMATS.items() if kind != "text")  # files whose text is under `text_key`
COMPRESSED = {b"\x1f\x8b": ("gzip", ".gz"), b"PK\x03\x04": ("zip", ".zip"), b"PK\x05\x06": ("zip", ".zip"),
              b"BZh": ("bzip2", ".bz2"), b"\xfd7zXZ\x00": ("xz", ".xz"), b"\x28\xb5\x2f\xfd": ("zstd", ".zst")}
SNIFF_BYTES = 8192  # how much of a file is looked at


def file_format(path: Path) -> str:
    """How `path`'s text is read: FORMATS' kind for its suffix, else "text"."""
    return FORMATS.get(path.suffix, "text")


def check_text(path: Path, head: bytes) -> None:
    """A one-line ValueError when a file meant as text is compressed or binary (its first bytes `head`): what the
    file is and what to do, where reading it as text would only say it is not UTF-8."""
    for magic, (kind, suffix) in COMPRESSED.items():
        if not head.startswith(magic):
            continue
        if kind == "zip" and path.suffix not in ("", suffix, *FORMATS):  # .docx, .epub, .pt ...
            raise setting_error("{0} is a zip archive (as {1} files are), not text: export its text to a .txt file "
                                "and point {path} at that", path, path.suffix)
        out = path.stem if path.suffix == suffix and Path(path.stem).suffix else f"{path.stem}.txt"
        out = path.with_name(f"{path.stem}-text.txt" if out == path.name else out)  # (never the file itself)
        how = command_line(["unzip", str(path)] if kind == "zip" else [kind, "-dc", str(path)]) + \
            ("" if kind == "zip" else f" > {command_line([str(out)])}")
        raise setting_error("{0} is compressed ({1}), not text: decompress it first ({2}) and point {path} at the "
                            "text", path, kind, how)
    if head.startswith(b"%PDF-"):
        raise setting_error("{0} is a PDF document, not text: extract its text to a .txt file first (e.g. {1}) and "
                            "point {path} at that", path, command_line(["pdftotext", str(path)]))
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise setting_error("{0} is UTF-16 text (it starts with a UTF-16 byte-order mark): re-save it as UTF-8", path)
    if (at := head.find(b"\x00")) >= 0:
        raise setting_error("{0} is a binary file, not text (a NUL byte at offset {1:,}): point {path} at text (a "
                            "text, .jsonl, .json or .csv file, parquet, or a directory of them)", path, at)


def archives(suffixes) -> list[str]:
    """The compression suffixes (.gz, .zip, ...) among `suffixes`: a directory of these needs decompressing."""
    known = {suffix for _, suffix in COMPRESSED.values()}
    return sorted(set(suffixes) & known)
