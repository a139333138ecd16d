"""The ``poissonmark`` command line: keys, generate, detect.

``--json`` prints one JSON object (the contract later checks rely on); without it the output is
for people. Errors print one line naming the problem and exit with status 2 (bad input) or 1
(environment: Redis, model files). Secrets never appear in any output.
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.text import Text

from service.errors import PoissonmarkError
from service.settings import Settings

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Watermarked LLM text by keyed multi-draft speculative sampling (MPFR).")
keys_app = typer.Typer(no_args_is_help=True, help="Create, list and revoke watermark keys.")
app.add_typer(keys_app, name="keys")

out = Console()
err = Console(stderr=True)
log = logging.getLogger("poissonmark")


def _fail(message: str, code: int = 2) -> NoReturn:
    err.print(f"[bold red]error:[/] {message}", highlight=False, markup=True)
    raise typer.Exit(code)


def _emit_json(payload: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(payload, allow_nan=False, ensure_ascii=False) + "\n")


@contextlib.contextmanager
def _store(settings: Settings) -> Iterator[Any]:
    from service.kek import load_or_create_kek
    from service.keystore import KeyStore
    from service.redis import close_redis, open_redis

    url = settings.redis_url.get_secret_value() if settings.redis_url else None
    client = open_redis(url, settings.home)
    try:
        kek = settings.kek_bytes()
        if kek is None:
            kek = load_or_create_kek(settings.home)
        yield KeyStore(client, kek)
    finally:
        close_redis(client)


@contextlib.contextmanager
def _errors() -> Iterator[None]:
    """Map domain and input errors to one clear line; never a traceback for bad input."""
    try:
        yield
    except PoissonmarkError as exc:
        _fail(str(exc), 1 if type(exc).__name__ in ("KeyStoreUnavailable",) else 2)
    except ValueError as exc:
        _fail(str(exc))
    except OSError as exc:
        _fail(f"{type(exc).__name__}: {exc}", 1)


def _load(settings: Settings, model: str | None, device: str | None, quiet: bool) -> Any:
    from sampler.models import load_model

    with err.status("loading model…", spinner="dots") if not quiet else contextlib.nullcontext():
        return load_model(model or settings.model, settings.home, device or settings.device,
                          on_progress=(lambda msg: err.print(msg)) if not quiet else None)


def _tokenizer(settings: Settings, model: str | None, quiet: bool) -> Any:
    from sampler.models import load_tokenizer, materialise

    with err.status("preparing tokenizer…") if not quiet else contextlib.nullcontext():
        materialise(model or settings.model, settings.home,
                    (lambda msg: err.print(msg)) if not quiet else None)
        return load_tokenizer(model or settings.model, settings.home)


Json = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]
ModelOpt = Annotated[str | None, typer.Option("--model", help="Alias or local HF model dir.")]


@keys_app.command("create")
def keys_create(
    context_width: Annotated[int, typer.Option("--context-width", min=1, max=64,
                                               help="Label width m.")] = 4,
    no_masking: Annotated[bool, typer.Option("--no-masking",
                                             help="Turn the repeated-context rule off.")] = False,
    model: ModelOpt = None,
    as_json: Json = False,
) -> None:
    """Create a key bound to the model's tokenizer."""
    from sampler.models import tokenizer_fingerprint

    settings = Settings()
    with _errors():
        fingerprint = tokenizer_fingerprint(_tokenizer(settings, model, as_json))
        with _store(settings) as store:
            record = store.create(fingerprint, context_width, not no_masking)
    public = record.public()
    view = {k: public[k] for k in ("key_id", "context_width", "prf_version", "tokenizer",
                                   "created_at")} | {"masking": record.masking}
    if as_json:
        _emit_json(view)
    else:
        out.print(f"created key [bold]{record.key_id}[/] (context width {record.context_width}, "
                  f"tokenizer {record.tokenizer})")


@keys_app.command("list")
def keys_list(
    include_revoked: Annotated[bool, typer.Option("--all", help="Include revoked keys.")] = False,
    as_json: Json = False,
) -> None:
    """List keys (public fields only)."""
    settings = Settings()
    with _errors(), _store(settings) as store:
        records = store.list_keys(include_revoked=include_revoked)
    if as_json:
        _emit_json({"keys": [r.public() for r in records]})
        return
    for r in records:
        state = "revoked" if r.revoked else "active"
        out.print(f"{r.key_id}  m={r.context_width}  {state}  {r.created_at}  {r.tokenizer}")


@keys_app.command("revoke")
def keys_revoke(key_id: str, as_json: Json = False) -> None:
    """Revoke a key: it can no longer generate (detection with it still works)."""
    settings = Settings()
    with _errors(), _store(settings) as store:
        record = store.revoke(key_id)
    if as_json:
        _emit_json(record.public())
    else:
        out.print(f"revoked {record.key_id}")


@app.command()
def generate(
    key: Annotated[str, typer.Option("--key", help="Key id.")],
    prompt: Annotated[str | None, typer.Option("--prompt", help="User message.")] = None,
    messages_file: Annotated[Path | None, typer.Option(
        "--messages-file", help="JSON list of {role, content} chat messages.")] = None,
    method: Annotated[
        str,
        typer.Option(
            help="ar, basic-uwm, pfr, mpfr, pfr-nowm, mpfr-nowm; unwatermarked baselines vsps, gls"
        ),
    ] = "mpfr",
    drafter: Annotated[str, typer.Option(help="ngram, self:N, heads:PATH or model:PATH")] = "ngram",
    drafts: Annotated[int, typer.Option("--drafts", "-B", help="Drafts B.")] = 4,
    lookahead: Annotated[int, typer.Option("--lookahead", "-L", help="Lookahead L.")] = 4,
    max_new_tokens: Annotated[int, typer.Option(help="At most this many new tokens.")] = 128,
    temperature: float = 1.0,
    top_k: Annotated[int, typer.Option(help="0 = off.")] = 50,
    top_p: float = 1.0,
    nonce: Annotated[int | None, typer.Option(
        help="Request nonce (repeated contexts); random when omitted.")] = None,
    model: ModelOpt = None,
    device: Annotated[str | None, typer.Option(help="auto, cpu, cuda…")] = None,
    as_json: Json = False,
) -> None:
    """Generate a watermarked completion (an exact sample of the model)."""
    from keyed import KeyedSource
    from sampler.completion import complete, prompt_ids
    from sampler.decoder import SamplerConfig
    from sampler.models import tokenizer_fingerprint
    from sampler.processing import Processing

    settings = Settings()
    with _errors():
        if (prompt is None) == (messages_file is None):
            raise ValueError("give exactly one of --prompt or --messages-file")
        messages = None
        if messages_file is not None:
            try:
                messages = json.loads(messages_file.read_text())
            except json.JSONDecodeError as exc:
                raise ValueError(f"--messages-file: not JSON ({exc.msg} at line {exc.lineno})"
                                 ) from None
            if isinstance(messages, dict) and "messages" in messages:
                messages = messages["messages"]
            if not isinstance(messages, list):
                raise ValueError("--messages-file: expected a JSON list of messages")
        config = SamplerConfig(method, drafts, lookahead, max_new_tokens,
                               Processing(temperature, top_k, top_p))
        if nonce is None:
            nonce = secrets.randbelow(2**63)
        with _store(settings) as store:
            record = store.get_active(key)
        loaded = _load(settings, model, device, as_json)
        if tokenizer_fingerprint(loaded.tokenizer) != record.tokenizer:
            raise ValueError(f"key {record.key_id} was made for tokenizer {record.tokenizer}; "
                             "this model's tokenizer differs")
        source = KeyedSource(record.secret, record.context_width, record.masking, nonce)
        ids = prompt_ids(loaded, prompt, messages)
        done = complete(loaded, ids, config, source, drafter)
    r, s = done.result, done.result.stats
    payload = {
        "text": done.text,
        "token_ids": list(r.token_ids),
        "key_id": record.key_id,
        "method": r.method,
        "drafter": done.drafter,
        "nonce": nonce,
        "finish_reason": r.finish_reason,
        "watermark_applied": r.watermark_applied,
        "stats": {
            "emitted_tokens": s.emitted_tokens,
            "target_forward_passes": s.target_forward_passes,
            "aatps": s.aatps,
            "drafter_calls": s.drafter_calls,
            "accepted_per_level": list(s.accepted_per_level),
            "prefill_seconds": s.prefill_seconds,
            "seconds": s.seconds,
            "tokens_per_second": s.tokens_per_second,
        },
    }
    if as_json:
        _emit_json(payload)
        return
    out.print(done.text, highlight=False, markup=False)
    out.print(
        f"\n[dim]{s.emitted_tokens} tokens · {s.target_forward_passes} target passes · "
        f"AATPS {s.aatps:.2f} · {s.tokens_per_second:.1f} tok/s · {r.method}"
        f"{' + ' + done.drafter if done.drafter else ''} · watermark "
        f"{'on' if r.watermark_applied else 'off'} · nonce {nonce}[/]"
    )


@app.command()
def detect(
    key: Annotated[
        str | None,
        typer.Option(
            "--key",
            help="Key id. Omit to test every active key of --tenant made for this model's "
            "tokenizer (multi-key: the best key's p-value is corrected for their number).",
        ),
    ] = None,
    text: Annotated[str | None, typer.Option("--text", help="Text to check.")] = None,
    file: Annotated[Path | None, typer.Option("--file", help="Read the text from a file.")
                    ] = None,
    token_ids: Annotated[str | None, typer.Option(
        "--token-ids", help="JSON list of exact token ids (scored instead of re-tokenizing).")
    ] = None,
    alpha: Annotated[float, typer.Option(help="Level of the verdict.")] = 0.01,
    score: Annotated[list[str] | None, typer.Option(
        "--score", help="Also compute this score: u, li or lattimore (repeat for several; "
        "aaronson is always computed and decides the verdict).")] = None,
    li_delta: Annotated[float, typer.Option("--li-delta", help="Δ of the li score.")] = 0.1,
    lattimore_epsilon: Annotated[float, typer.Option(
        "--lattimore-epsilon", help="ε of the lattimore score.")] = 1e-3,
    spans: Annotated[bool, typer.Option(
        "--spans", help="Report the strongest watermarked spans (window scan, corrected).")
    ] = False,
    jsonl: Annotated[Path | None, typer.Option(
        "--jsonl", help="Corpus mode: one {id, text} or {id, token_ids} JSON object per line; "
        "writes one JSON result per line.")] = None,
    output: Annotated[Path | None, typer.Option(
        "--output", help="With --jsonl: append results here (default stdout); ids already in "
        "the file are skipped, so an interrupted run resumes.")] = None,
    workers: Annotated[int, typer.Option(
        "--workers", min=1, max=256, help="With --jsonl: worker processes.")] = 1,
    no_tokens: Annotated[bool, typer.Option(
        "--no-tokens", help="With --jsonl: leave per-token evidence out of each result.")
    ] = False,
    tenant: Annotated[
        str, typer.Option(help="Without --key: the tenant whose keys are tested.")
    ] = "default",
    include_revoked: Annotated[
        bool, typer.Option("--include-revoked", help="Without --key: test revoked keys too.")
    ] = False,
    model: ModelOpt = None,
    as_json: Json = False,
) -> None:
    """Test a text for the key's watermark (text from --text, --file or stdin), or every line
    of a JSONL corpus (--jsonl). Without --key, test every key of the tenant (multi-key)."""
    from detector import DetectOptions, TokenizerMismatch, check_tokenizer
    from detector import detect as run_detect
    from keyed import KeyedSource
    from sampler.models import tokenizer_fingerprint

    settings = Settings()
    with _errors():
        if text is not None and file is not None:
            raise ValueError("give at most one of --text or --file")
        if not 0.0 < alpha <= 0.5:
            raise ValueError(f"--alpha: expected a level in (0, 0.5], got {alpha}")
        if jsonl is not None and (text is not None or file is not None or token_ids is not None):
            raise ValueError("--jsonl reads its inputs from the file: drop --text/--file/"
                             "--token-ids")
        if jsonl is None and (output is not None or workers != 1 or no_tokens):
            raise ValueError("--output, --workers and --no-tokens go with --jsonl")
        families = _score_families(score or [], li_delta, lattimore_epsilon)
        if file is not None:
            text = file.read_text(encoding="utf-8")
        ids = None
        if token_ids is not None:
            try:
                ids = json.loads(token_ids)
            except json.JSONDecodeError:
                raise ValueError("--token-ids: expected a JSON list of integers") from None
            if not isinstance(ids, list):
                raise ValueError("--token-ids: expected a JSON list of integers")
        if jsonl is None and text is None and ids is None:
            if sys.stdin.isatty():
                raise ValueError("give --text, --file, --token-ids or pipe the text on stdin")
            text = sys.stdin.read()
        if key is None:
            if jsonl is not None:
                raise ValueError("--jsonl needs --key (corpus mode tests one key)")
            _detect_all_keys(
                settings, tenant, include_revoked, model, as_json,
                text=text, token_ids=ids,
                options=DetectOptions(alpha=alpha, scores=families, spans=spans),
            )  # fmt: skip
            return
        with _store(settings) as store:
            record = store.get(key)
        tokenizer = _tokenizer(settings, model, as_json or jsonl is not None)
        try:
            check_tokenizer(record.tokenizer, tokenizer_fingerprint(tokenizer), record.key_id)
        except TokenizerMismatch as exc:
            _fail(str(exc))
        source = KeyedSource(record.secret, record.context_width, record.masking)
        if jsonl is not None:
            counts = _detect_jsonl(
                tokenizer, source, record.key_id, jsonl, output, workers=workers, alpha=alpha,
                scores=families, spans=spans, keep_tokens=not no_tokens,
            )
            err.print(", ".join(f"{v} {k}" for k, v in counts.items()), highlight=False)
            return
        options = DetectOptions(alpha=alpha, key_id=record.key_id, scores=families, spans=spans)
        result = run_detect(tokenizer, source, text=text, token_ids=ids, options=options)
    if as_json:
        _emit_json(result.to_json())
        return
    _print_detection(result)


def _detect_all_keys(
    settings: Settings,
    tenant: str,
    include_revoked: bool,
    model: str | None,
    as_json: bool,
    **options: Any,
) -> None:
    """``detect`` without ``--key``: ``detector.detect_multi`` over the tenant's keys made for
    this tokenizer; prints the corrected result, then the best key's evidence."""
    from detector import detect_multi
    from keyed import KeyedSource
    from sampler.models import tokenizer_fingerprint

    with _store(settings) as store:
        records = store.list_keys(tenant, include_revoked=include_revoked)
    tokenizer = _tokenizer(settings, model, as_json)
    fingerprint = tokenizer_fingerprint(tokenizer)
    sources = {
        r.key_id: KeyedSource(r.secret, r.context_width, r.masking)
        for r in records
        if r.tokenizer == fingerprint
    }
    if not sources:
        which = "active or revoked" if include_revoked else "active"
        _fail(f"tenant {tenant!r} has no {which} key for this model's tokenizer ({fingerprint})")
    result = detect_multi(tokenizer, sources, **options)
    if as_json:
        _emit_json(result.to_json())
        return
    out.print(
        f"tested {result.num_keys} key{'s' if result.num_keys != 1 else ''} of tenant "
        f"{tenant}; best key [bold]{result.best_key_id}[/]; p-value corrected for "
        f"{result.num_keys} keys: {result.p_value:.3g} (log10 p {result.log10_p_value:.2f})",
        highlight=False,
    )
    out.print(f"verdict (corrected): [bold]{result.verdict.value}[/]")
    out.print("[dim]best key's own result:[/]")
    _print_detection(result.best)


def _print_detection(result: Any) -> None:
    a = result.scores["aaronson"]
    colour = {"watermarked": "bold green", "not_detected": "bold",
              "insufficient_evidence": "bold yellow"}[result.verdict.value]
    out.print(f"verdict: [{colour}]{result.verdict.value}[/]")
    out.print(f"p-value: {a.p_value:.3g}   log10 p: {a.log10_p_value:.2f}   "
              f"scored tokens: {result.num_scored} of {result.num_tokens}   "
              f"Aaronson score: {a.score:.1f}", highlight=False)
    for name, p in result.scores.items():
        if name != "aaronson":
            out.print(f"[dim]{name}: log10 p {p.log10_p_value:.2f} ({p.method})[/]",
                      highlight=False)
    skipped = ", ".join(f"{k} {v}" for k, v in result.skipped.items() if v)
    if skipped:
        out.print(f"[dim]skipped: {skipped}[/]")
    if result.spans is not None:
        for span in result.spans.spans:
            out.print(f"span chars {span.start}-{span.end} ({span.num_scored} scored tokens): "
                      f"log10 p {span.p_value.log10_p_value:.2f}, corrected for "
                      f"{result.spans.windows_scanned} windows {span.corrected_log10_p_value:.2f}",
                      highlight=False)
    shown = Text()
    for t in result.tokens:
        if t.status == "scored":
            # per-token Aaronson term: mean 1 under H0; brighter = more evidence
            strength = min(t.score / 4.0, 1.0)
            shown.append(t.text, style=f"on rgb(0,{int(60 + 140 * strength)},0)")
        else:
            shown.append(t.text, style="dim")
    out.print(shown)
    out.print("[dim](scored tokens on green, brighter = stronger evidence; dim = skipped)[/]")


def _score_families(names: list[str], li_delta: float, lattimore_epsilon: float) -> list[Any]:
    """``--score`` names -> score families with the CLI's parameters (ValueError if unknown)."""
    from detector import SCORE_NAMES, lattimore_score, li_score

    families: list[Any] = []
    for name in names:
        if name == "li":
            families.append(li_score(li_delta))
        elif name == "lattimore":
            families.append(lattimore_score(lattimore_epsilon))
        elif name in SCORE_NAMES:
            families.append(name)
        else:
            raise ValueError(f"--score: expected one of {', '.join(SCORE_NAMES)}, got {name!r}")
    return families


def _done_ids(output: Path) -> set[str]:
    """Ids already written to ``output`` (resume). A torn last line (an interrupted write) is
    cut off so that appending continues on a clean line."""
    if not output.exists():
        return set()
    data = output.read_bytes()
    if data and not data.endswith(b"\n"):
        data = data[: data.rfind(b"\n") + 1]
        with output.open("r+b") as f:
            f.truncate(len(data))
    done: set[str] = set()
    for line in data.decode("utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("id"), str):
            done.add(row["id"])
    return done


def _parse_jsonl_line(line: str) -> tuple[str | None, Any]:
    """(id, CorpusItem) for a valid input line, or (id or None, error message)."""
    from detector import CorpusItem

    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        return None, f"not JSON ({exc.msg})"
    if not isinstance(row, dict):
        return None, "expected a JSON object with id and text or token_ids"
    raw_id = row.get("id")
    if isinstance(raw_id, bool) or not isinstance(raw_id, str | int):
        return None, "expected an id (string or integer)"
    item_id = str(raw_id)
    text, ids = row.get("text"), row.get("token_ids")
    if text is None and ids is None:
        return item_id, "expected text or token_ids"
    if text is not None and not isinstance(text, str):
        return item_id, "text: expected a string"
    if ids is not None and not isinstance(ids, list):
        return item_id, "token_ids: expected a list of integers"
    return item_id, CorpusItem(item_id, text=text, token_ids=None if ids is None else tuple(ids))


def _detect_jsonl(
    tokenizer: Any, source: Any, key_id: str, path: Path, output: Path | None, *, workers: int,
    alpha: float, scores: list[Any], spans: bool, keep_tokens: bool,
) -> dict[str, int]:
    """Corpus mode: one JSON result per input line, in input order, to ``output`` or stdout.

    Lines that are not valid inputs get ``{"id", "line", "error"}``; ids already present in
    ``output`` are skipped (resume). Progress goes to stderr. Returns counts by outcome.
    """
    from collections import deque

    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from detector import CorpusItem, DetectOptions, detect_many

    done = _done_ids(output) if output is not None else set()
    with path.open(encoding="utf-8") as f:
        total = sum(1 for line in f if line.strip())
    counts = {"detected": 0, "watermarked": 0, "errors": 0, "skipped (already in output)": 0}
    pending: deque[dict[str, Any] | None] = deque()  # None: the next detection result goes here

    def items() -> Iterator[CorpusItem]:
        with path.open(encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                item_id, parsed = _parse_jsonl_line(line)
                if item_id is not None and item_id in done:
                    counts["skipped (already in output)"] += 1
                    progress.advance(task)
                elif isinstance(parsed, CorpusItem):
                    pending.append(None)
                    yield parsed
                else:
                    pending.append({"id": item_id, "line": number, "error": parsed})

    sink = output.open("a", encoding="utf-8") if output is not None else sys.stdout

    def write(payload: dict[str, Any]) -> None:
        if "error" in payload:
            counts["errors"] += 1
        else:
            counts["detected"] += 1
            counts["watermarked"] += payload["verdict"] == "watermarked"
            if not keep_tokens:
                payload.pop("tokens")
        sink.write(json.dumps(payload, allow_nan=False, ensure_ascii=False) + "\n")
        sink.flush()  # a line is complete on disk before the next starts (resume)
        progress.advance(task)

    columns = (TextColumn("detecting"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TimeRemainingColumn())
    try:
        with Progress(*columns, console=err, transient=False) as progress:
            task = progress.add_task("detect", total=total)
            options = DetectOptions(alpha=alpha, key_id=key_id, scores=scores, spans=spans)
            results = detect_many(tokenizer, source, items(), workers=workers, options=options)
            for result in results:
                while pending and pending[0] is not None:
                    write(pending.popleft())  # type: ignore[arg-type]
                pending.popleft()
                write(result.to_json())
            while pending:
                write(pending.popleft())  # type: ignore[arg-type]
    finally:
        if output is not None:
            sink.close()
    return counts


# --- The HTTP service and its API tokens ---------------------------------------------------

tokens_app = typer.Typer(no_args_is_help=True, help="Create, list and revoke API bearer tokens.")
app.add_typer(tokens_app, name="tokens")


DEFAULT_PROMPTS = (
    Path(__file__).resolve().parents[1] / "data" / "prompts-eli5.jsonl",
    Path(__file__).resolve().parents[1] / "data" / "prompts-summarize.jsonl",
)


@app.command()
def distill(
    out_dir: Annotated[Path, typer.Option("--out", help="Where heads, checkpoint and logs go.")],
    objective: Annotated[str, typer.Option(help="mdraft, rkl, fkl or ce.")] = "mdraft",
    alpha: Annotated[float, typer.Option(
        help="MDraft blending coefficient α in [0, 1] (mdraft only).")] = 0.9,
    proposals: Annotated[int, typer.Option(
        "--proposals", "-K", help="MDraft drafts K per context (mdraft only).")] = 4,
    lookahead: Annotated[int, typer.Option("--lookahead", "-L", help="Heads L.")] = 4,
    steps: Annotated[int, typer.Option(help="Optimiser steps.")] = 300,
    anchors: Annotated[int, typer.Option(help="Contexts per step.")] = 32,
    lr: Annotated[float, typer.Option(help="AdamW peak learning rate.")] = 1e-3,
    seed: int = 0,
    eval_every: Annotated[int, typer.Option(
        min=0, help="Held-out τ every N steps (0 = off).")] = 100,
    init: Annotated[Path | None, typer.Option(
        help="Start from these heads (e.g. off-policy ce heads), as MDraft post-trains.")] = None,
    prompts: Annotated[list[Path] | None, typer.Option(
        "--prompts", help="Prompt JSONL files (default: the shared ELI5 and summarise sets)."
    )] = None,
    max_new_tokens: Annotated[int, typer.Option(help="Rollout length per prompt.")] = 128,
    model: ModelOpt = None,
    device: Annotated[str | None, typer.Option(help="auto, cpu, cuda…")] = None,
    as_json: Json = False,
) -> None:
    """Train parallel drafter heads (MDraft); resumes from OUT/checkpoint.pt. Use the result
    as ``--drafter heads:OUT``."""
    from rich.progress import Progress

    from sampler.distill import DistillConfig, evaluate, prepare_data, reach_summary, train
    from sampler.mdraft import Objective

    settings = Settings()
    with _errors():
        config = DistillConfig(
            Objective.named(objective, alpha, proposals), lookahead, steps, anchors, lr,
            seed=seed, eval_every=eval_every, init=str(init) if init else None,
        )
        files = list(prompts or DEFAULT_PROMPTS)
        for path in files:
            if not path.is_file():
                raise ValueError(f"--prompts: {path} does not exist")
        loaded = _load(settings, model, device, as_json)
        if init is not None:  # fail before the rollouts, not after
            from sampler.heads import ParallelHeads

            ParallelHeads.load(init, loaded.model)
        with Progress(console=err, disable=as_json, transient=False) as progress:
            tasks: dict[str, Any] = {}

            def data_progress(what: str, done: int, total: int) -> None:
                if what not in tasks:
                    tasks[what] = progress.add_task(what, total=total)
                progress.update(tasks[what], completed=done)

            data = prepare_data(loaded.model, loaded.tokenizer, files, settings.home,
                                max_new_tokens, seed, data_progress)
            task = progress.add_task(f"training ({objective})", total=steps)

            def on_step(state: Any, loss: float) -> None:
                last = state.log[-1]
                note = f" · held-out {reach_summary(last['eval'])}" if "eval" in last else ""
                progress.update(task, completed=state.step,
                                description=f"training ({objective}) loss {loss:.3f}{note}")

            heads, state = train(loaded.model, data.train, data.train_hidden, data.heldout,
                                 data.heldout_hidden, config, out_dir, on_step)
            status = err.status("evaluating on held-out prompts…")
            with status if not as_json else contextlib.nullcontext():
                result = evaluate(heads, loaded.model, data.heldout, data.heldout_hidden)
        (out_dir / "evaluation.json").write_text(json.dumps(result, indent=1) + "\n")
    payload = {"out": str(out_dir), "objective": objective, "steps": state.step,
               "train_seconds": state.seconds, "train_rollouts": len(data.train),
               "heldout_rollouts": len(data.heldout), "evaluation": result}
    if as_json:
        _emit_json(payload)
        return
    out.print(f"heads written to {out_dir} after {state.step} steps "
              f"({state.seconds / 60:.1f} min) · held-out {reach_summary(result)}")
    out.print(f"[dim]use: poissonmark generate --drafter heads:{out_dir} …[/]")


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Bind address [POISSONMARK_HOST].")] = None,
    port: Annotated[int | None, typer.Option(help="Port [POISSONMARK_PORT].")] = None,
    workers: Annotated[int | None, typer.Option(
        min=1, max=64, help="Server processes [POISSONMARK_WORKERS]; > 1 needs REDIS_URL.")] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
) -> None:
    """Run the HTTP service (FastAPI under uvicorn; settings from POISSONMARK_* variables)."""
    from service.server import prepare_workers, run_server

    with _errors():
        settings = Settings()
        processes = settings.workers if workers is None else workers
        if log_level.lower() not in ("debug", "info", "warning", "error"):
            raise ValueError(f"--log-level: expected debug, info, warning or error: {log_level}")
        shared = prepare_workers(settings) if processes > 1 else None
    try:
        run_server(
            settings,
            host=host or settings.host,
            port=settings.port if port is None else port,
            workers=processes,
            log_level=log_level.lower(),
        )
    finally:
        if shared is not None:
            shutil.rmtree(shared, ignore_errors=True)


@contextlib.contextmanager
def _token_store(settings: Settings) -> Iterator[Any]:
    from service.api_tokens import TokenStore
    from service.redis import close_redis, open_redis

    url = settings.redis_url.get_secret_value() if settings.redis_url else None
    client = open_redis(url, settings.home)
    try:
        yield TokenStore(client, settings.redis_prefix)
    finally:
        close_redis(client)


@tokens_app.command("create")
def tokens_create(
    tenant: Annotated[str, typer.Option(help="The tenant the token acts for.")] = "default",
    scope: Annotated[list[str] | None, typer.Option(
        "--scope", help="generate, detect or keys; repeat for several (default: all).")] = None,
    name: Annotated[str, typer.Option(help="A label shown in lists.")] = "",
    as_json: Json = False,
) -> None:
    """Create an API token. It is shown once, here; the service stores only its hash."""
    from service.api_tokens import SCOPES

    settings = Settings()
    with _errors(), _token_store(settings) as store:
        token, record = store.create(tenant, scope or SCOPES, name)
    if as_json:
        _emit_json(record.public() | {"token": token})
        return
    err.print(f"created token [bold]{record.token_id}[/] for tenant {record.tenant} "
              f"(scopes {', '.join(record.scopes)}); store it now, it is not shown again:")
    out.print(token, highlight=False, markup=False)


@tokens_app.command("list")
def tokens_list(
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's tokens.")] = None,
    as_json: Json = False,
) -> None:
    """List API tokens (ids, tenants, scopes; never the tokens)."""
    settings = Settings()
    with _errors(), _token_store(settings) as store:
        records = store.list_tokens(tenant)
    if as_json:
        _emit_json({"tokens": [r.public() for r in records]})
        return
    for r in records:
        state = "revoked" if r.revoked else "active"
        out.print(f"{r.token_id}  {r.tenant}  {','.join(r.scopes)}  {state}  {r.created_at}"
                  f"  {r.name}", highlight=False, markup=False)


@tokens_app.command("revoke")
def tokens_revoke(token_id: str, as_json: Json = False) -> None:
    """Revoke an API token by its id; it stops working at once."""
    settings = Settings()
    with _errors(), _token_store(settings) as store:
        record = store.revoke(token_id)
    if as_json:
        _emit_json(record.public())
    else:
        out.print(f"revoked token {record.token_id}")


def main() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own status line shows progress; keep stderr clean
    hf_logging.set_verbosity_error()
    app()


if __name__ == "__main__":
    main()
