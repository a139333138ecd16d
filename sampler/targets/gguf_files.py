"""A GGUF file as the model: its identity, its header check and its tokenizer's source.

``sampler.targets.model_files`` converts a GGUF file once (transformers' ``gguf_file=``) into
an HF directory under ``<data dir>/models/``; this module says where, when that copy is
current, and whether a file is a GGUF at all, without importing torch (the ``gguf`` package,
~0.4 s to import, only where its reader is needed).

The copy of ``path/to/name.gguf`` lives in ``<data dir>/models/gguf/<stem>-<12 hex of the
SHA-256 of the resolved path>``, and it is current while the file's resolved path, size and
modification time (nanoseconds) equal those its ``.complete`` marker records. Path, size and
time cost one ``stat``; a hash of the content would read gigabytes at every load, and a hash
of the header alone misses a file whose weights changed under the same metadata (a fine-tune
written with the same names and quantisation). A file rewritten in place replaces its copy;
a copy of the file elsewhere is converted again (disk, once).

Shapes: no tensors cross this module; the vocabulary is a Python list of token strings.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)
"""GGUF format versions llama.cpp and the ``gguf`` package read."""
MARKER = ".complete"
"""The file a finished conversion writes last: its source's identity (``identity``)."""
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
"""The files that make a GGUF's directory its tokenizer's source (``tokenizer_beside``)."""


class GgufFileError(ValueError):
    """A file that is not a GGUF llama.cpp and the ``gguf`` package can read."""


def check_header(path: Path) -> None:
    """Check that ``path`` is a readable file starting with a GGUF header (magic, version):
    eight bytes, no parsing.

    Raises:
        GgufFileError: unreadable, too short, another format or an unknown version; the
            message is one line naming the file.
    """
    try:
        with path.open("rb") as handle:
            head = handle.read(8)
    except OSError as exc:
        raise GgufFileError(f"{path}: cannot read ({exc.strerror or type(exc).__name__})") from None
    if len(head) < 8 or head[:4] != GGUF_MAGIC:
        raise GgufFileError(f"{path}: not a GGUF file (no GGUF header)")
    (version,) = struct.unpack("<I", head[4:])
    if version not in GGUF_VERSIONS:
        raise GgufFileError(f"{path}: GGUF version {version}, expected one of {GGUF_VERSIONS}")


def read(path: Path) -> Any:
    """The file parsed by ``gguf.GGUFReader`` (metadata and tensor table; the weights stay
    memory-mapped), after ``check_header``.

    Raises:
        GgufFileError: the header check fails, or the metadata or tensor table is cut short
            or malformed (one line naming the file and the reader's reason).
    """
    check_header(path)
    from gguf import GGUFReader

    try:
        return GGUFReader(path)
    except (ValueError, IndexError, KeyError, OverflowError, struct.error, OSError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise GgufFileError(f"{path}: not a readable GGUF file ({reason})") from None


def vocabulary(reader: Any) -> list[str]:
    """The token strings of a ``read`` file (``tokenizer.ggml.tokens``), by id.

    Raises:
        GgufFileError: the file holds no vocabulary.
    """
    field = reader.fields.get("tokenizer.ggml.tokens")
    if field is None:
        raise GgufFileError(f"{reader.data.filename}: no tokenizer.ggml.tokens in the file")
    return [bytes(field.parts[i]).decode("utf-8", "replace") for i in field.data]


def identity(path: Path) -> dict[str, Any]:
    """What a current copy of GGUF ``path`` records: resolved path, size in bytes and
    modification time in nanoseconds (module docstring).

    Raises:
        OSError: the file cannot be examined.
    """
    resolved = path.resolve()
    stat = resolved.stat()
    return {"source": str(resolved), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def cache_dir(path: Path, data_dir: Path) -> Path:
    """Where the converted copy of GGUF ``path`` lives (module docstring)."""
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
    return data_dir / "models" / "gguf" / f"{path.stem}-{digest}"


def tokenizer_cache(directory: Path) -> Path:
    """Where the tokenizer alone of the copy ``directory`` is converted (``detect`` before the
    weights ever were): a sibling, ``<directory>.tokenizer``."""
    return directory.with_name(directory.name + ".tokenizer")


def is_current(directory: Path, wanted: dict[str, Any]) -> bool:
    """Whether ``directory`` holds a finished conversion whose marker records ``wanted``
    (each of its entries equal)."""
    try:
        recorded: Any = json.loads((directory / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(recorded, dict) and all(recorded.get(k) == v for k, v in wanted.items())


def tokenizer_beside(path: Path) -> Path | None:
    """The directory whose tokenizer overrides the one in GGUF ``path``: the file's own
    directory when it holds ``tokenizer.json`` and ``tokenizer_config.json`` (an HF repository
    with its GGUF export beside the original files; for a link, the link's directory, as in
    the hub's cache of snapshots), else None (the file's tokenizer)."""
    parent = path.expanduser().absolute().parent
    return parent if all((parent / name).is_file() for name in TOKENIZER_FILES) else None


def check_tokenizer_matches(directory: Path, path: Path) -> None:
    """Check that the tokenizer in ``directory`` names every id of GGUF ``path`` as the file
    does (the ``tokenizer.json`` vocabulary and added tokens against ``tokenizer.ggml.tokens``):
    a tokenizer whose ids mean other tokens to the weights would make every text nonsense.

    Raises:
        GgufFileError: a differing token (the first one named), another vocabulary size, or
            unreadable files.
    """
    try:
        spec = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise GgufFileError(f"{directory / 'tokenizer.json'}: cannot read ({exc})") from None
    listed = spec.get("model", {}).get("vocab") or {}
    # BPE and WordPiece map token -> id; Unigram lists [token, score] pairs in id order
    vocab: dict[str, int] = (
        dict(listed) if isinstance(listed, dict) else {pair[0]: i for i, pair in enumerate(listed)}
    )
    for added in spec.get("added_tokens") or []:
        vocab[added["content"]] = added["id"]
    tokens = vocabulary(read(path))
    by_id = {i: token for token, i in vocab.items()}
    if len(by_id) != len(tokens):
        raise GgufFileError(
            f"the tokenizer in {directory} has {len(by_id)} tokens, {path.name} has "
            f"{len(tokens)}: remove its tokenizer.json to use the file's own"
        )
    for i, token in enumerate(tokens):
        if by_id.get(i) != token:
            raise GgufFileError(
                f"the tokenizer in {directory} names id {i} {by_id.get(i)!r}, {path.name} "
                f"names it {token!r}: remove its tokenizer.json to use the file's own"
            )
