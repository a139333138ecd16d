"""Detection of one text under one key: text -> ids -> pivots -> scores -> p-value -> verdict.

Pipeline (DESIGN §4; MPFR paper Alg. 8 and App. E; Aaronson & Kirchner 2023):
1. tokens: the text with the key's tokenizer (``add_special_tokens=False``, offsets kept,
   never trimmed or normalised), or the exact ``token_ids`` supplied (case C9).
2. plan: ``keyed.detection_plan`` scores position t iff its whole label window lies in the
   text (t >= m), the token is not special, and its label was not scored earlier in the text;
   other positions are skipped with a reason (``no_context``, ``special_token``,
   ``repeated_context``). The prompt never enters: the count does not depend on it (case C4).
3. pivots: r_t = U(κ(k, ℓ_t), w_t, 1) from ``keyed`` — the same PRF the sampler races with.
4. scores: every registered family's per-token terms and p-value (``detector.scores``).
5. verdict at α from the Aaronson p-value and ``min_scored_tokens(α)`` (case C5).

Shapes: T tokens in the text, M scored; keys (M, 2) int64, pivots (M,) float64.
"""

from __future__ import annotations

import math
import operator
from collections import Counter
from collections.abc import Sequence

import torch

from detector.evidence import Detection, TokenEvidence, Verdict
from detector.scores import SCORES
from detector.stats import PValue, min_scored_tokens
from detector.tokens import Tokenizer, tokenize
from keyed import KeyedSource, SkipReason, detection_plan, keys_tensor, label_key, pivots

DEFAULT_ALPHA = 0.01
MAX_ALPHA = 0.5


def detect(
    tokenizer: Tokenizer,
    source: KeyedSource,
    *,
    text: str | None = None,
    token_ids: Sequence[int] | None = None,
    alpha: float = DEFAULT_ALPHA,
    key_id: str | None = None,
) -> Detection:
    """Test a text for the watermark of one key.

    Args:
        tokenizer: the key's Hugging Face tokenizer (fast, for character offsets of ``text``).
        source: the key's keyed source (secret, context width m, masking); its nonce is unused:
            repeated contexts, the only nonce-keyed positions, are never scored.
        text: the text as submitted (may be empty or whitespace only: M = 0, p = 1).
        token_ids: (T,) exact ids to score instead of re-tokenizing ``text``; each in
            [0, len(tokenizer)). With ``text`` too, ``retokenization_matches`` reports whether
            tokenizing the text reproduces them.
        alpha: level in (0, 0.5] for the verdict.
        key_id: the key's public id, echoed in the result.
    Returns:
        a ``Detection``: verdict, p-values (``"aaronson"``, method ``"exact"``), per-token
        evidence with character offsets, skip counts.
    Raises:
        ValueError: naming the field and the limit — alpha outside (0, 0.5]; neither text nor
            token_ids; a non-string text; a token id that is not an int or is outside the vocab;
            a slow tokenizer with text only.
    """
    alpha = _check_alpha(alpha)
    if text is None and token_ids is None:
        raise ValueError("expected at least one of text or token_ids, got neither")
    if text is not None and not isinstance(text, str):
        raise ValueError(f"expected text to be a string, got {type(text).__name__}")
    if token_ids is not None:
        token_ids = _check_token_ids(token_ids, len(tokenizer))
    if key_id is not None and not isinstance(key_id, str):
        raise ValueError(f"expected key_id to be a string, got {type(key_id).__name__}")
    if not isinstance(source, KeyedSource):
        raise ValueError(f"expected source to be a KeyedSource, got {type(source).__name__}")

    tokenized = tokenize(tokenizer, text, token_ids)
    special = frozenset(int(i) for i in tokenizer.all_special_ids)
    # Repeated labels are skipped whatever the key's masking flag (DESIGN §2, detection): with
    # masking off, generation reuses a label's clocks, so a repeat would count the same pivot
    # twice and break the Gamma null on repetitive human text.
    plan = detection_plan(tokenized.ids, source.context_width, masking=True, special_ids=special)
    scored = [p for p in plan if p.skip is None]

    labels = [p.label for p in scored]
    assert all(label is not None for label in labels)  # the plan labels every scored position
    keys = keys_tensor([label_key(source.secret, label or ()) for label in labels])  # (M, 2)
    observed = torch.tensor([tokenized.ids[p.position] for p in scored], dtype=torch.int64)
    r = pivots(keys, observed).numpy()  # (M,) float64
    evaluated = {name: family.evaluate(r) for name, family in SCORES.items()}
    aaronson_terms, aaronson = evaluated["aaronson"]

    tokens: list[TokenEvidence] = []
    m = 0  # index of the next scored position in r
    for p in plan:
        start, end = tokenized.spans[p.position]
        piece = tokenized.text[start:end]
        token = tokenized.ids[p.position]
        if p.skip is None:
            pivot, score = float(r[m]), float(aaronson_terms[m])
            tokens.append(TokenEvidence(token, piece, start, end, "scored", None, pivot, score))
            m += 1
        else:
            tokens.append(
                TokenEvidence(token, piece, start, end, "skipped", p.skip.value, None, None)
            )
    counts = Counter(p.skip for p in plan if p.skip is not None)
    needed = min_scored_tokens(alpha)
    return Detection(
        key_id=key_id,
        num_tokens=len(plan),
        num_scored=len(scored),
        verdict=verdict(aaronson, len(scored), alpha, needed),
        scores={name: p_value for name, (_, p_value) in evaluated.items()},
        tokens=tuple(tokens),
        skipped={reason.value: counts.get(reason, 0) for reason in SkipReason},
        retokenization_matches=tokenized.retokenization_matches,
        alpha=alpha,
        min_scored_tokens=needed,
    )


def verdict(p: PValue, num_scored: int, alpha: float, needed: int) -> Verdict:
    """``watermarked`` if p < α; else ``insufficient_evidence`` if M < needed; else
    ``not_detected`` (DESIGN §4). ``needed`` is ``min_scored_tokens(α)``."""
    if p.p_value < alpha:
        return Verdict.WATERMARKED
    if num_scored < needed:
        return Verdict.INSUFFICIENT_EVIDENCE
    return Verdict.NOT_DETECTED


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
