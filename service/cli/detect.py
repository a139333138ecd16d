"""``poissonmark detect``: is this text watermarked by one key, or by any key of a tenant?

The keys and the statistics are ``service.jobs.detection``'s, as for ``POST /v1/detect``, and
``--json`` prints the same ``DetectResponse`` that endpoint answers
(``service.jobs.detect_response``: the verdict on the best key's corrected p-value, and each key's
own result under ``results``); without it ``service.cli.detect_output`` shows the result for
people. ``--jsonl`` runs a corpus (``service.cli.detect_corpus``).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from detector import SCORE_NAMES, DetectOptions, ScoreFamily, lattimore_score, li_score
from detector.combined import REFERENCE_MEAN_SCORE
from service.cli.common import (
    Json,
    ModelOpt,
    emit_json,
    err,
    errors,
    key_store,
    read_settings,
    tokenizer_and_fingerprint,
)
from service.cli.detect_corpus import CorpusRun, check_corpus_options, run_corpus
from service.cli.detect_output import show, show_model_tests, show_multi_key, tenant_line
from service.errors import NoKeys
from service.settings import model_name


def score_families(names: Sequence[str], li_delta: float, lattimore_epsilon: float) -> list[Any]:
    """``--score`` names -> score families with the CLI's parameters (ValueError if unknown)."""
    families: list[str | ScoreFamily] = []
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


def parse_token_ids(raw: str | None) -> list[int] | None:
    """``--token-ids``: a JSON list (the detector checks the values)."""
    if raw is None:
        return None
    try:
        ids = json.loads(raw)
    except json.JSONDecodeError:
        raise ValueError("--token-ids: expected a JSON list of integers") from None
    if not isinstance(ids, list):
        raise ValueError("--token-ids: expected a JSON list of integers")
    return ids


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
    file: Annotated[Path | None, typer.Option("--file", help="Read the text from a file.")] = None,
    token_ids: Annotated[
        str | None,
        typer.Option(
            "--token-ids", help="JSON list of exact token ids (scored instead of re-tokenizing)."
        ),
    ] = None,
    alpha: Annotated[float, typer.Option(help="Level of the verdict.")] = 0.01,
    score: Annotated[
        list[str] | None,
        typer.Option(
            "--score",
            help="Also compute this score: u, li or lattimore (repeat for several; "
            "aaronson is always computed and decides the verdict).",
        ),
    ] = None,
    reference_mean_score: Annotated[
        float,
        typer.Option(
            "--reference-mean-score",
            help="Per-token mean Aaronson term of a typically watermarked text (1.2-100; human "
            "text averages 1): a text too short to reach --alpha at this mean is "
            "insufficient_evidence.",
        ),
    ] = REFERENCE_MEAN_SCORE,
    li_delta: Annotated[float, typer.Option("--li-delta", help="Δ of the li score.")] = 0.1,
    lattimore_epsilon: Annotated[
        float, typer.Option("--lattimore-epsilon", help="ε of the lattimore score.")
    ] = 1e-3,
    spans: Annotated[
        bool,
        typer.Option(
            "--spans", help="Report the strongest watermarked spans (window scan, corrected)."
        ),
    ] = False,
    realign: Annotated[
        bool,
        typer.Option(
            "--realign",
            help="Also run the edit-tolerant re-aligned test (reported beside the verdict).",
        ),
    ] = False,
    entropy_weighting: Annotated[
        bool,
        typer.Option(
            "--entropy-weighting",
            help="Also run the entropy-weighted test (loads the model: one forward over the "
            "text; reported beside the verdict). Give the generation's --temperature, --top-k "
            "and --top-p.",
        ),
    ] = False,
    likelihood_ratio: Annotated[
        bool,
        typer.Option(
            "--likelihood-ratio",
            help="Also run the likelihood-ratio test (loads the model: one forward; reported "
            "beside the verdict). Strongest with the generation's --prompt and --temperature, "
            "--top-k, --top-p.",
        ),
    ] = False,
    edit_filter: Annotated[
        bool,
        typer.Option(
            "--edit-filter",
            help="Also run the edit-filtered test: leaves out the labels that hold a token the "
            "model ranks past 1,000 (a likely edit; loads the model: one forward; reported "
            "beside the verdict). For text someone may have edited.",
        ),
    ] = False,
    prompt: Annotated[
        str | None,
        typer.Option(
            "--prompt",
            help="With --entropy-weighting, --likelihood-ratio or --edit-filter: the "
            "generation's prompt (one user message); the model's law is read after it instead "
            "of after BOS.",
        ),
    ] = None,
    temperature: Annotated[
        float, typer.Option("--temperature", help="With a model test: T > 0.")
    ] = 1.0,
    top_k: Annotated[int, typer.Option("--top-k", help="With a model test: top-k (0 = off).")] = 50,
    top_p: Annotated[
        float, typer.Option("--top-p", help="With a model test: top-p in (0, 1].")
    ] = 1.0,
    jsonl: Annotated[
        Path | None,
        typer.Option(
            "--jsonl",
            help="Corpus mode: one {id, text} or {id, token_ids} JSON object per line; "
            "writes one JSON result per line.",
        ),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            help="With --jsonl: append results here (default stdout); ids already in "
            "the file are skipped, so an interrupted run resumes.",
        ),
    ] = None,
    workers: Annotated[
        int,
        typer.Option(
            "--workers",
            min=1,
            max=256,
            help="With --jsonl: worker processes (--engine ray: detector actors).",
        ),
    ] = 1,
    engine: Annotated[
        str,
        typer.Option(
            "--engine",
            help="With --jsonl: 'local' (this host's processes) or 'ray' (Ray Data over a "
            "Ray cluster; pip install 'poissonmark\\[ray]').",
        ),
    ] = "local",
    address: Annotated[
        str | None,
        typer.Option(
            "--address",
            help="With --engine ray: the cluster to join ('auto', or host:port); default "
            "starts a one-node Ray in this process.",
        ),
    ] = None,
    q_values: Annotated[
        bool,
        typer.Option(
            "--q-values",
            help="With --jsonl and --output: when the run is done, add each document's "
            "Benjamini-Hochberg q-value across the file (rewrites the output).",
        ),
    ] = False,
    no_tokens: Annotated[
        bool, typer.Option("--no-tokens", help="Leave per-token evidence out of the JSON.")
    ] = False,
    tenant: Annotated[
        str, typer.Option(help="Without --key: the tenant whose keys are tested.")
    ] = "default",
    include_revoked: Annotated[
        bool, typer.Option("--include-revoked", help="Without --key: test revoked keys too.")
    ] = False,
    exit_status: Annotated[
        bool,
        typer.Option(
            "--exit-status",
            help="Exit with the verdict, as grep does: 0 watermarked, 1 not (not_detected or "
            "insufficient_evidence), 2 an error. Not with --jsonl.",
        ),
    ] = False,
    model: ModelOpt = None,
    as_json: Json = False,
) -> None:
    """Test a text for the key's watermark (text from --text, --file or stdin), or every line
    of a JSONL corpus (--jsonl). Without --key, test every key of --tenant (multi-key; the
    tenant tested is printed, on stderr with --json).

    Exit status: 0 when a verdict was printed, whatever it is. With --exit-status: 0 for
    watermarked, 1 for not watermarked, 2 for an error. Without --exit-status an error exits 2
    (bad input) or 1 (Redis or files unreachable)."""
    from service.jobs.detect_response import detect_response
    from service.jobs.detection import choose_keys, detect_keys

    settings = read_settings()
    with errors(2 if exit_status else None):
        if text is not None and file is not None:
            raise ValueError("give at most one of --text or --file")
        if exit_status and jsonl is not None:
            raise ValueError("--exit-status goes without --jsonl (a corpus has many verdicts)")
        if jsonl is not None and (text is not None or file is not None or token_ids is not None):
            raise ValueError(
                "--jsonl reads its inputs from the file: drop --text/--file/--token-ids"
            )
        if jsonl is None and (output is not None or workers != 1):
            raise ValueError("--output and --workers go with --jsonl")
        check_corpus_options(jsonl, output, engine, address, q_values)
        processing = _model_processing(
            entropy_weighting or likelihood_ratio or edit_filter, jsonl, temperature, top_k, top_p
        )
        if prompt is not None and processing is None:
            raise ValueError(
                "--prompt goes with --entropy-weighting, --likelihood-ratio or --edit-filter"
            )
        if jsonl is not None and key is None:
            raise ValueError("--jsonl needs --key (corpus mode tests one key)")
        families = score_families(score or [], li_delta, lattimore_epsilon)
        options = DetectOptions(
            alpha=alpha,
            scores=families,
            spans=spans,
            realign=realign,
            reference_mean_score=reference_mean_score,
        )
        ids = parse_token_ids(token_ids)
        # --file and stdin as their bytes say (UTF-8; no newline translation: "\r\n" stays,
        # so offsets index the file and the same bytes give the same result either way)
        if file is not None:
            text = _utf8(file.read_bytes(), str(file))
        if jsonl is None and text is None and ids is None:
            if sys.stdin.isatty():
                raise ValueError("give --text, --file, --token-ids or pipe the text on stdin")
            text = _utf8(sys.stdin.buffer.read(), "stdin")
        tok, fingerprint = tokenizer_and_fingerprint(settings, model, as_json or jsonl is not None)
        name = model_name(model or settings.model)
        with key_store(settings) as store:
            try:
                records = choose_keys(
                    store,
                    fingerprint,
                    None if key else tenant,
                    key,
                    include_revoked=include_revoked,
                    max_keys=settings.max_keys_per_detect,
                    model=name,
                )
            except NoKeys:
                raise ValueError(
                    f"tenant {tenant!r} has no key for the tokenizer of model {name!r}: give "
                    "--key, --tenant to test another tenant's keys, or --model the model the "
                    "keys were made for (`poissonmark keys list` shows it)"
                ) from None
        if jsonl is not None:
            run = CorpusRun(workers, not no_tokens, engine, address, q_values)
            run_corpus(tok, records[0], jsonl, output, options, run)
            return
        found = detect_keys(tok, records, options, text=text, token_ids=ids)
        tests = None
        if processing is not None:
            from sampler.completion import prompt_ids
            from service.cli.common import load
            from service.jobs.model_tests import run_model_tests

            loaded = load(settings, model, None, as_json)
            tests = run_model_tests(
                found,
                loaded.target,
                processing,
                entropy_weighting=entropy_weighting,
                likelihood_ratio=likelihood_ratio,
                edit_filter=edit_filter,
                prompt_ids=None if prompt is None else prompt_ids(loaded, prompt),
            )
        response = detect_response(found, tokens=not no_tokens, model_tests=tests)
    if as_json:
        emit_json(response.model_dump(mode="json"))
        if key is None:  # stdout is the API's shape: the tenant goes to stderr
            err.print(tenant_line(found, tenant), highlight=False, markup=False)
    else:
        if key is None:
            show_multi_key(found, tenant)
        else:
            show(found.best)
        show_model_tests(response)
    if exit_status:
        raise typer.Exit(0 if found.verdict.value == "watermarked" else 1)


def _model_processing(
    wanted: bool, jsonl: Path | None, temperature: float, top_k: int, top_p: float
) -> Any:
    """The processing of the model tests (``--entropy-weighting``, ``--likelihood-ratio``,
    ``--edit-filter``; None without them); ValueError naming the option."""
    if not wanted:
        if (temperature, top_k, top_p) != (1.0, 50, 1.0):
            raise ValueError(
                "--temperature, --top-k and --top-p go with --entropy-weighting, "
                "--likelihood-ratio or --edit-filter"
            )
        return None
    if jsonl is not None:
        raise ValueError(
            "--entropy-weighting / --likelihood-ratio / --edit-filter: not in corpus mode (--jsonl)"
        )
    if not (math.isfinite(temperature) and 0.0 < temperature <= 100.0):
        raise ValueError(f"--temperature: expected a number in (0, 100], got {temperature}")
    if top_k < 0:
        raise ValueError(f"--top-k: expected an int >= 0 (0 = off), got {top_k}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"--top-p: expected a number in (0, 1], got {top_p}")
    from sampler.processing_config import Processing

    return Processing(temperature, top_k, top_p)


def _utf8(raw: bytes, where: str) -> str:
    """``raw`` decoded as UTF-8, exactly (ValueError naming ``where`` if it is not UTF-8)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{where}: not UTF-8 (byte {exc.start})") from None
