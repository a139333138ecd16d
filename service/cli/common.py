"""What every command group shares: the consoles, the error mapping, the stores, the model.

``--json`` prints one JSON object on stdout; without it the output is for people. Errors print
one line on stderr naming the problem and exit with status 2 (bad input) or 1 (environment:
Redis, model files; 2 as well under ``detect --exit-status``). Secrets never appear in any
output.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console

from detector.errors import DetectorError
from service.errors import KeyStoreUnavailable, PoissonmarkError
from service.settings import Settings

if TYPE_CHECKING:
    import redis

    from sampler.models import LoadedModel
    from service.keys.api_tokens import TokenStore
    from service.keys.store import KeyStore

out = Console()
err = Console(stderr=True)


def plain_when_piped() -> None:
    """Output into a pipe or a file is not wrapped at 80 columns (one line stays one line for
    grep); a terminal keeps rich's wrapping at its width. Decided when a command runs."""
    for console in (out, err):
        console.soft_wrap = not console.is_terminal


Json = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]
ModelOpt = Annotated[
    str | None, typer.Option("--model", help="Alias, GGUF file or local HF model dir.")
]
DeviceOpt = Annotated[str | None, typer.Option("--device", help="auto, cpu, cuda…")]
PrecisionOpt = Annotated[
    str | None,
    typer.Option(
        "--precision",
        help="Target precision: auto (on the CPU gguf where llama-cpp-python is installed, "
        "else the row-invariant bfloat16 runner where the CPU has AMX bfloat16, else "
        "float32), float32, bfloat16, or gguf (the model's GGUF weights through llama.cpp).",
    ),
]


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``error: message`` on stderr and exit with ``code``."""
    err.print(f"[bold red]error:[/] {message}", highlight=False, markup=True)
    raise typer.Exit(code)


def emit_json(payload: dict[str, Any]) -> None:
    """One JSON object on stdout: finite numbers only, UTF-8 as is."""
    sys.stdout.write(json.dumps(payload, allow_nan=False, ensure_ascii=False) + "\n")


def report(payload: dict[str, Any], as_json: bool, line: str) -> None:
    """``payload`` as JSON with ``--json``, else ``line`` for people."""
    if as_json:
        emit_json(payload)
    else:
        out.print(line, highlight=False)


@contextlib.contextmanager
def errors(code: int | None = None) -> Iterator[None]:
    """Map domain and input errors to one clear line; never a traceback for bad input.

    Exit status 2 for bad input, 1 for the environment (Redis, files), or ``code`` for every
    error when given (``detect --exit-status`` keeps 1 for "not watermarked").
    """
    try:
        yield
    except (PoissonmarkError, DetectorError) as exc:
        environment = isinstance(exc, KeyStoreUnavailable)  # Redis
        fail(str(exc), code or (1 if environment else 2))
    except ValueError as exc:
        fail(str(exc), code or 2)
    except OSError as exc:  # "<path>: No such file or directory", as the shell says it
        where = f"{exc.filename}: " if exc.filename is not None else ""
        fail(f"{where}{exc.strerror or str(exc) or type(exc).__name__}", code or 1)


def read_settings() -> Settings:
    """The settings from the environment; one that does not validate is its line on stderr
    (``service.settings.SettingsError``) and exit status 2, never a traceback."""
    with errors():
        return Settings()


@contextlib.contextmanager
def _redis(settings: Settings) -> Iterator[redis.Redis]:
    from service.keys.redis import close_redis, open_redis

    url = settings.redis_url.get_secret_value() if settings.redis_url else None
    client = open_redis(url, settings.home)
    try:
        yield client
    finally:
        close_redis(client)


@contextlib.contextmanager
def key_store(settings: Settings) -> Iterator[KeyStore]:
    """The watermark key store (the KEK from settings, else the data dir's KEK file)."""
    from service.keys.kek import load_or_create_kek
    from service.keys.store import KeyStore

    with _redis(settings) as client:
        kek = settings.kek_bytes()
        current = load_or_create_kek(settings.home) if kek is None else kek
        yield KeyStore(client, current, settings.redis_prefix, settings.previous_keks())


@contextlib.contextmanager
def token_store(settings: Settings) -> Iterator[TokenStore]:
    """The API token store (its digest key from the KEK, as ``key_store``'s)."""
    from service.keys.api_tokens import TokenStore, digest_key
    from service.keys.kek import load_or_create_kek

    with _redis(settings) as client:
        kek = settings.kek_bytes()
        key = digest_key(load_or_create_kek(settings.home) if kek is None else kek)
        yield TokenStore(client, key, settings.redis_prefix)


def _progress(quiet: bool) -> Callable[[str], None] | None:
    return None if quiet else err.print


def _status(message: str, quiet: bool) -> contextlib.AbstractContextManager[Any]:
    return contextlib.nullcontext() if quiet else err.status(message, spinner="dots")


def quiet_transformers() -> None:
    """Keep transformers' progress bars and warnings off stderr (our status line shows
    progress); called where a command first uses transformers, not at start-up (importing
    transformers costs most of a one-shot command that does not need it)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]


def load(
    settings: Settings,
    model: str | None,
    device: str | None,
    quiet: bool,
    precision: str | None = None,
) -> LoadedModel:
    """The model and tokenizer (``--model``/``--device``/``--precision`` over the settings)."""
    from sampler.models import load_model

    quiet_transformers()
    with _status("loading model…", quiet):
        return load_model(
            model or settings.model,
            settings.home,
            device or settings.device,
            on_progress=_progress(quiet),
            precision=precision or settings.precision,
        )


def tokenizer_and_fingerprint(
    settings: Settings, model: str | None, quiet: bool
) -> tuple[Any, str]:
    """The model's tokenizer and its fingerprint (remembered with the model's files:
    ``sampler.targets.model_files.model_tokenizer_fingerprint``)."""
    from sampler.targets.model_files import model_tokenizer_fingerprint

    tok = tokenizer(settings, model, quiet)
    return tok, model_tokenizer_fingerprint(tok, model or settings.model, settings.home)


def tokenizer(settings: Settings, model: str | None, quiet: bool) -> Any:
    """The tokenizer detection needs (``sampler.targets.model_files.load_detection_tokenizer``: the
    ``tokenizers`` library alone where the model's files allow, so neither torch nor
    transformers is imported), converting a GGUF's tokenizer first if it never was
    (transformers, quietened, then; the weights stay as they are)."""
    from sampler.targets.model_files import load_detection_tokenizer, tokenizer_dir

    progress = _progress(quiet)

    def converting(message: str) -> None:
        quiet_transformers()
        if progress is not None:
            progress(message)

    with _status("preparing tokenizer…", quiet):
        tokenizer_dir(model or settings.model, settings.home, converting)
        return load_detection_tokenizer(model or settings.model, settings.home)
