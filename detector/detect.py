"""Detection of one text under one key: text -> ids -> pivots -> scores -> p-value -> verdict.

Pipeline (docs/design.md §4; MPFR paper Alg. 8 and App. E; Aaronson & Kirchner 2023):
1. tokens: each reading of the text with the key's tokenizer (``add_special_tokens=False``,
   offsets into the submitted text): as submitted, and its canonical reading when it differs
   (``detector.readings``: the reading with the smallest verdict p is kept and every p-value
   corrected for the readings tried); or the exact ``token_ids`` supplied (case C9).
2. plan: ``keyed.detection_plan_arrays`` (the columnar form of ``keyed.detection_plan``,
   tested equal) scores position t iff its whole label window lies in the
   text (t >= m), the token is not special, and its label was not scored earlier in the text;
   other positions are skipped with a reason (``no_context``, ``special_token``,
   ``repeated_context``). The prompt never enters: the count does not depend on it (case C4).
3. pivots: r_t = U(κ(k, ℓ_t), w_t, 1) from ``keyed`` — the same PRF the sampler races with.
4. scores: the chosen families' per-token terms and p-values (``detector.scores``; Aaronson
   always).
5. verdict at α from the combined test — the whole-text Aaronson p and the best window in one
   weighted-Bonferroni p (``detector.combined``) — and the minimum detectable mean
   score at this M against ``options.reference_mean_score`` (case C5; ``needed_tokens``).
6. spans (optional): the strongest windows of Aaronson evidence (``detector.spans``).
7. re-aligned test (optional, ``options.realign``): the edit-tolerant p of
   ``detector.realign``, reported beside the verdict's.

Shapes: T tokens in the text, M scored; keys (M, 2) int64, pivots (M,) float64.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Final

import numpy as np

from detector.combined import (
    combined_test,
    min_detectable_mean_score,
    needed_tokens,
    whole_text_log_level,
)
from detector.evidence import Detection, TokenColumns, verdict
from detector.options import DetectOptions
from detector.readings import ReadText, best_of, corrected, report_for, tokenize_readings
from detector.realign import realigned_test
from detector.spans import find_spans
from detector.stats import PValue
from detector.tokens import TokenizedText, Tokenizer, tokenize
from keyed import (
    SKIP_CODES,
    KeyedSource,
    SkipReason,
    detection_plan_arrays,
    label_key_words,
    pivot_array,
)

DEFAULT_OPTIONS: Final = DetectOptions()
"""``detect``'s default: alpha 0.01, Aaronson alone, no key id, no span search."""


def detect(
    tokenizer: Tokenizer,
    source: KeyedSource,
    *,
    text: str | None = None,
    token_ids: Sequence[int] | None = None,
    options: DetectOptions = DEFAULT_OPTIONS,
) -> Detection:
    """Test a text for the watermark of one key.

    Args:
        tokenizer: the key's Hugging Face tokenizer (fast, for character offsets of ``text``).
            The caller checks that it is the key's (``check_tokenizer``).
        source: the key's keyed source (secret, context width m, masking); its nonce is unused:
            repeated contexts, the only nonce-keyed positions, are never scored.
        text: the text as submitted (may be empty or whitespace only: M = 0, p = 1).
        token_ids: (T,) exact ids to score instead of re-tokenizing ``text``; each in
            [0, len(tokenizer)). With ``text`` too, they must decode to exactly ``text``
            (``TextTokenIdsMismatch`` otherwise), and ``retokenization_matches`` reports whether
            tokenizing the text reproduces them.
        options: level, key id, score families, span search (``DetectOptions``, validated
            where it is made).
    Returns:
        a ``Detection``: verdict, p-value per score (``method`` ``"exact"`` or
        ``"chernoff_bound"``), per-token evidence with character offsets and every score's
        per-token term, skip counts, spans when asked.
    Raises:
        ValueError: naming the field and the limit — neither text nor token_ids; a non-string
            text; a token id that is not an int or is outside the vocab; a slow tokenizer with
            text only; options that are not a ``DetectOptions``.
    """
    check_options(options)
    if not isinstance(source, KeyedSource):
        raise ValueError(f"expected source to be a KeyedSource, got {type(source).__name__}")
    read = read_input(tokenizer, text, token_ids)
    special = frozenset(int(i) for i in tokenizer.all_special_ids)
    return detect_readings(read, special, source, options)


def read_input(
    tokenizer: Tokenizer, text: str | None, token_ids: Sequence[int] | None
) -> tuple[ReadText, ...]:
    """Validate ``text``/``token_ids`` (as ``detect``) and tokenize each reading once
    (``detector.readings.tokenize_readings``: the raw and canonical readings of a text alone;
    exact ids as given)."""
    _check_input(text, token_ids)
    if token_ids is not None:
        token_ids = _check_token_ids(token_ids, len(tokenizer))
    return tokenize_readings(tokenizer, text, token_ids)


def detect_readings(
    read: Sequence[ReadText],
    special: frozenset[int],
    source: KeyedSource,
    options: DetectOptions,
) -> Detection:
    """``detect`` after ``read_input``: each reading tested, the one with the smallest verdict
    p kept, every p-value corrected for the readings tried (``detector.readings``)."""
    found = [detect_tokenized(r.tokenized, special, source, options) for r in read]
    best = best_of(found, lambda d: d.verdict_log10_p_value)
    return corrected(found[best], report_for(read, best))


def tokenize_input(
    tokenizer: Tokenizer, text: str | None, token_ids: Sequence[int] | None
) -> TokenizedText:
    """Validate ``text``/``token_ids`` (as ``detect``) and tokenize them once, as submitted
    (the raw reading alone)."""
    _check_input(text, token_ids)
    if token_ids is not None:
        token_ids = _check_token_ids(token_ids, len(tokenizer))
    return tokenize(tokenizer, text, token_ids)


def detect_tokenized(
    tokenized: TokenizedText,
    special: frozenset[int],
    source: KeyedSource,
    options: DetectOptions,
) -> Detection:
    """``detect`` after tokenization and validation (shared with ``detect_multi`` and
    ``detect_many``).

    Args:
        tokenized: the text's ids and character spans. special: ids never scored.
        Others as ``detect``.
    """
    # Repeated labels are skipped whatever the key's masking flag (docs/design.md §2,
    # detection): with masking off, generation reuses a label's clocks, so a repeat would count
    # the same pivot twice and break the Gamma null on repetitive human text.
    ids = tokenized.ids  # (T,) int64
    plan = detection_plan_arrays(ids, source.context_width, special)
    keys = label_key_words(source.secret, plan.labels)  # (M, 2) int64
    r = pivot_array(keys, ids[plan.scored])  # (M,) float64
    alpha = options.alpha
    evaluated = {family.name: family.evaluate(r) for family in options.families}
    aaronson_terms = evaluated["aaronson"][0]  # (M,)
    if not all(np.isfinite(terms).all() for terms, _ in evaluated.values()):
        raise AssertionError("a score family produced a non-finite term")  # families' contract
    evidence = TokenColumns(
        text=tokenized.text,
        ids=ids,
        starts=tokenized.starts,
        ends=tokenized.ends,
        skip=plan.skip,
        pivots=r,
        terms={name: terms for name, (terms, _) in evaluated.items()},
    )
    num_scored = int(plan.scored.shape[0])
    counts = np.bincount(evidence.skip, minlength=len(SKIP_CODES)).tolist()
    needed = needed_tokens(alpha, options.reference_mean_score)
    aaronson = evaluated["aaronson"][1]
    test = combined_test(aaronson_terms, aaronson.log_p_value)
    mu = min_detectable_mean_score(num_scored, whole_text_log_level(alpha, num_scored))
    realigned = None
    if options.realign:
        realigned = realigned_test(ids, source.context_width, special, source.secret)
    search = None
    if options.spans:
        search = find_spans(
            aaronson_terms,
            plan.scored.tolist(),
            tokenized.starts,
            tokenized.ends,
            options.max_spans,
        )
    return Detection(
        key_id=options.key_id,
        num_tokens=int(ids.shape[0]),
        num_scored=num_scored,
        verdict=verdict(
            PValue.from_log(aaronson.score, test.log_p, "exact"), num_scored, alpha, needed
        ),
        scores={name: p_value for name, (_, p_value) in evaluated.items()},
        evidence=evidence,
        skipped={reason.value: counts[SKIP_CODES.index(reason)] for reason in SkipReason},
        retokenization_matches=tokenized.retokenization_matches,
        alpha=alpha,
        min_scored_tokens=needed,
        spans=search,
        score_params={family.name: dict(family.params) for family in options.families},
        test=test,
        min_detectable_mean_score=mu,
        reference_mean_score=options.reference_mean_score,
        realigned=realigned,
        context_width=source.context_width,
    )


def _check_input(text: str | None, token_ids: Sequence[int] | None) -> None:
    if text is None and token_ids is None:
        raise ValueError("expected at least one of text or token_ids, got neither")
    if text is not None and not isinstance(text, str):
        raise ValueError(f"expected text to be a string, got {type(text).__name__}")
    if text is not None and not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(
                f"expected text to be valid Unicode, got a lone surrogate at character {exc.start}"
            ) from None


def check_options(options: DetectOptions) -> None:
    """Reject options that are not a ``DetectOptions`` (its fields validate themselves)."""
    if not isinstance(options, DetectOptions):
        raise ValueError(f"expected options to be a DetectOptions, got {type(options).__name__}")


def _check_token_ids(token_ids: Sequence[int], vocab_size: int) -> list[int]:
    if isinstance(token_ids, str | bytes):
        raise ValueError("expected token_ids to be a sequence of ints, got a string")
    ids: list[int] = []
    for i, token in enumerate(token_ids):
        if isinstance(token, bool):
            raise ValueError(f"expected token_ids[{i}] to be an int, got {token!r}")
        try:
            value = operator.index(token)
        except TypeError:
            raise ValueError(f"expected token_ids[{i}] to be an int, got {token!r}") from None
        if not 0 <= value < vocab_size:
            raise ValueError(f"expected token_ids[{i}] in [0, {vocab_size}), got {value}")
        ids.append(value)
    return ids
