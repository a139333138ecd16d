"""Detection of one text under one key: text -> ids -> pivots -> scores -> p-value -> verdict.

Pipeline (DESIGN §4; MPFR paper Alg. 8 and App. E; Aaronson & Kirchner 2023):
1. tokens: the text with the key's tokenizer (``add_special_tokens=False``, offsets kept,
   never trimmed or normalised), or the exact ``token_ids`` supplied (case C9).
2. plan: ``keyed.detection_plan_arrays`` (the columnar form of ``keyed.detection_plan``,
   tested equal) scores position t iff its whole label window lies in the
   text (t >= m), the token is not special, and its label was not scored earlier in the text;
   other positions are skipped with a reason (``no_context``, ``special_token``,
   ``repeated_context``). The prompt never enters: the count does not depend on it (case C4).
3. pivots: r_t = U(κ(k, ℓ_t), w_t, 1) from ``keyed`` — the same PRF the sampler races with.
4. scores: the chosen families' per-token terms and p-values (``detector.scores``; Aaronson
   always).
5. verdict at α from the Aaronson p-value and ``min_scored_tokens(α)`` (case C5).
6. spans (optional): the strongest windows of Aaronson evidence (``detector.spans``).

Shapes: T tokens in the text, M scored; keys (M, 2) int64, pivots (M,) float64.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence

import numpy as np

from detector.evidence import Detection, TokenColumns, Verdict
from detector.scores import ScoreFamily, resolve_scores
from detector.spans import DEFAULT_MAX_SPANS, find_spans
from detector.stats import PValue, min_scored_tokens
from detector.tokens import TokenizedText, Tokenizer, tokenize
from keyed import (
    SKIP_CODES,
    KeyedSource,
    SkipReason,
    detection_plan_arrays,
    label_key_words,
    pivot_array,
)

DEFAULT_ALPHA = 0.01
MAX_ALPHA = 0.5
DEFAULT_SCORES: tuple[str, ...] = ("aaronson",)
"""Scores computed by default: Aaronson alone (exact p, the most powerful of the four on real
SmolLM2 generations at 16-128 scored tokens: ``bench/results/detector.md``)."""


def detect(
    tokenizer: Tokenizer,
    source: KeyedSource,
    *,
    text: str | None = None,
    token_ids: Sequence[int] | None = None,
    alpha: float = DEFAULT_ALPHA,
    key_id: str | None = None,
    scores: Sequence[str | ScoreFamily] = DEFAULT_SCORES,
    spans: bool = False,
    max_spans: int = DEFAULT_MAX_SPANS,
) -> Detection:
    """Test a text for the watermark of one key.

    Args:
        tokenizer: the key's Hugging Face tokenizer (fast, for character offsets of ``text``).
            The caller checks that it is the key's (``check_tokenizer``).
        source: the key's keyed source (secret, context width m, masking); its nonce is unused:
            repeated contexts, the only nonce-keyed positions, are never scored.
        text: the text as submitted (may be empty or whitespace only: M = 0, p = 1).
        token_ids: (T,) exact ids to score instead of re-tokenizing ``text``; each in
            [0, len(tokenizer)). With ``text`` too, ``retokenization_matches`` reports whether
            tokenizing the text reproduces them.
        alpha: level in (0, 0.5] for the verdict.
        key_id: the key's public id, echoed in the result.
        scores: score families to compute besides Aaronson (always computed: the verdict, the
            evidence ``score`` and the spans use its exact p-value): names from
            ``detector.scores.SCORE_NAMES`` (``"u"``, ``"li"``, ``"lattimore"``) or families
            with other parameters (``li_score(0.2)``, ``lattimore_score(1e-4)``).
        spans: also run the span search (``detector.spans``) and report the strongest windows.
        max_spans: at most this many spans, in [1, 100].
    Returns:
        a ``Detection``: verdict, p-value per score (``method`` ``"exact"`` or
        ``"chernoff_bound"``), per-token evidence with character offsets and every score's
        per-token term, skip counts, spans when asked.
    Raises:
        ValueError: naming the field and the limit — alpha outside (0, 0.5]; neither text nor
            token_ids; a non-string text; a token id that is not an int or is outside the vocab;
            a slow tokenizer with text only; an unknown or repeated score; max_spans out of
            range.
    """
    alpha, families = check_options(alpha, scores, key_id, max_spans)
    if not isinstance(source, KeyedSource):
        raise ValueError(f"expected source to be a KeyedSource, got {type(source).__name__}")
    tokenized = tokenize_input(tokenizer, text, token_ids)
    special = frozenset(int(i) for i in tokenizer.all_special_ids)
    return detect_tokenized(
        tokenized,
        special,
        source,
        alpha=alpha,
        key_id=key_id,
        families=families,
        spans=spans,
        max_spans=max_spans,
    )


def tokenize_input(
    tokenizer: Tokenizer, text: str | None, token_ids: Sequence[int] | None
) -> TokenizedText:
    """Validate ``text``/``token_ids`` (as ``detect``) and tokenize them once."""
    if text is None and token_ids is None:
        raise ValueError("expected at least one of text or token_ids, got neither")
    if text is not None and not isinstance(text, str):
        raise ValueError(f"expected text to be a string, got {type(text).__name__}")
    if token_ids is not None:
        token_ids = _check_token_ids(token_ids, len(tokenizer))
    return tokenize(tokenizer, text, token_ids)


def detect_tokenized(
    tokenized: TokenizedText,
    special: frozenset[int],
    source: KeyedSource,
    *,
    alpha: float,
    key_id: str | None,
    families: tuple[ScoreFamily, ...],
    spans: bool,
    max_spans: int,
) -> Detection:
    """``detect`` after tokenization and validation (shared with ``detect_multi``).

    Args:
        tokenized: the text's ids and character spans. special: ids never scored.
        families: from ``resolve_scores`` (Aaronson first).
        Others as ``detect``.
    """
    # Repeated labels are skipped whatever the key's masking flag (DESIGN §2, detection): with
    # masking off, generation reuses a label's clocks, so a repeat would count the same pivot
    # twice and break the Gamma null on repetitive human text.
    ids = tokenized.ids  # (T,) int64
    plan = detection_plan_arrays(ids, source.context_width, special)
    keys = label_key_words(source.secret, plan.labels)  # (M, 2) int64
    r = pivot_array(keys, ids[plan.scored])  # (M,) float64
    evaluated = {family.name: family.evaluate(r) for family in families}
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
    needed = min_scored_tokens(alpha)
    aaronson = evaluated["aaronson"][1]
    search = None
    if spans:
        search = find_spans(
            aaronson_terms, plan.scored.tolist(), tokenized.starts, tokenized.ends, max_spans
        )
    return Detection(
        key_id=key_id,
        num_tokens=int(ids.shape[0]),
        num_scored=num_scored,
        verdict=verdict(aaronson, num_scored, alpha, needed),
        scores={name: p_value for name, (_, p_value) in evaluated.items()},
        evidence=evidence,
        skipped={reason.value: counts[SKIP_CODES.index(reason)] for reason in SkipReason},
        retokenization_matches=tokenized.retokenization_matches,
        alpha=alpha,
        min_scored_tokens=needed,
        spans=search,
        score_params={family.name: dict(family.params) for family in families},
    )


def verdict(p: PValue, num_scored: int, alpha: float, needed: int) -> Verdict:
    """``watermarked`` if p < α; else ``insufficient_evidence`` if M < needed; else
    ``not_detected`` (DESIGN §4). ``needed`` is ``min_scored_tokens(α)``."""
    if p.p_value < alpha:
        return Verdict.WATERMARKED
    if num_scored < needed:
        return Verdict.INSUFFICIENT_EVIDENCE
    return Verdict.NOT_DETECTED


def check_options(
    alpha: float, scores: Sequence[str | ScoreFamily], key_id: str | None, max_spans: int
) -> tuple[float, tuple[ScoreFamily, ...]]:
    """Validate the options shared by ``detect``, ``detect_multi`` and ``detect_many``."""
    alpha = _check_alpha(alpha)
    families = resolve_scores(scores)
    if key_id is not None and not isinstance(key_id, str):
        raise ValueError(f"expected key_id to be a string, got {type(key_id).__name__}")
    if isinstance(max_spans, bool) or not isinstance(max_spans, int) or not 1 <= max_spans <= 100:
        raise ValueError(f"expected max_spans an int in [1, 100], got {max_spans!r}")
    return alpha, families


def _check_alpha(alpha: float) -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, float | int):
        raise ValueError(f"expected alpha to be a number in (0, {MAX_ALPHA}], got {alpha!r}")
    value = float(alpha)
    if not (math.isfinite(value) and 0.0 < value <= MAX_ALPHA):
        raise ValueError(f"expected alpha in (0, {MAX_ALPHA}], got {alpha!r}")
    return value


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
