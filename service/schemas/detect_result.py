"""``POST /v1/detect`` and ``/v1/detect/batch``: the responses (the requests are
``service.schemas.detect``'s).

The response is the detector's wire shape (``detector.Detection.to_json``) per key, the best
key's p-value corrected for the number of keys tested (Bonferroni) giving the verdict.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from detector.bands import BAND_BLOCK, BAND_EDGES, NUM_BANDS

Verdict = Literal["watermarked", "not_detected", "insufficient_evidence"]


class ScoreOut(BaseModel):
    score: float = Field(description="The score's statistic over the scored tokens.")
    p_value: float = Field(description="May print 0 beside a finite log10_p_value.")
    log10_p_value: float
    method: str = Field(description="`exact` or `chernoff_bound`.")
    anlppt: float = Field(description="−ln p / M, nats per scored token.")
    params: dict[str, float] = Field(default_factory=dict)


class TokenEvidenceOut(BaseModel):
    """One token as the detector saw it. ``pivot``, ``score`` and ``terms`` are the keyed
    PRF's outputs: only for a token with the `evidence` scope and a request with `text` alone
    (never for caller-chosen `token_ids`); otherwise null, and `band` shows the evidence."""

    id: int
    text: str
    start: int = Field(description="Character offset of the piece in the text.")
    end: int
    status: Literal["scored", "skipped"]
    skip_reason: str | None
    band: int | None = Field(
        ge=0,
        lt=NUM_BANDS,
        description=f"Scored tokens: the evidence band of its block of {BAND_BLOCK} or more "
        "consecutive scored tokens (the block's mean Aaronson term: 0 at most "
        f"{BAND_EDGES[0]} (text without the watermark averages 1), 1 up to {BAND_EDGES[1]}, "
        f"2 up to {BAND_EDGES[2]}, 3 above); null when skipped.",
    )
    pivot: float | None = Field(description="r_t (scored; `evidence` scope only).")
    score: float | None = Field(
        description="The Aaronson term −ln(1 − r_t) (scored; `evidence` scope only)."
    )
    terms: dict[str, float] | None = Field(
        default=None,
        description="Each score family's per-token term (scored; `evidence` scope only).",
    )


class SpanOut(BaseModel):
    start: int
    end: int
    token_start: int
    token_end: int
    num_scored: int
    score: float
    p_value: float
    log10_p_value: float
    corrected_p_value: float = Field(
        description="min(1, W·R·p): corrected for the W windows and the R readings tried."
    )
    corrected_log10_p_value: float
    keys_corrected_p_value: float | None = Field(
        default=None,
        description="min(1, K·W·p): corrected for the windows and the K = `num_keys` · "
        "`readings_tried` pairs (a span is significant at alpha when this is below it).",
    )
    keys_corrected_log10_p_value: float | None = None


class VerdictTestOut(BaseModel):
    """The verdict's test: the whole-text p and the best window's in one valid p-value."""

    name: Literal["whole_text", "whole_text+spans"] = Field(
        description="`whole_text` below 16 scored tokens (no window), else `whole_text+spans`."
    )
    whole_text_weight: float = Field(
        description="Weighted Bonferroni: p = min(1, p_whole / a, W·p_best_window / (1 − a)) "
        "with this a (0.9); a valid p-value for 'the text or some window is watermarked'."
    )
    windows_scanned: int = Field(description="W, the windows of the span search.")
    p_value: float
    log10_p_value: float
    whole_text_log10_p_value: float = Field(description="The plain whole-text Aaronson p.")
    scan_log10_p_value: float = Field(
        description="The best window's p times W and R (capped at 1)."
    )


class PowerOut(BaseModel):
    """What this text could show: a not-significant result of a text too short to tell is
    `insufficient_evidence`."""

    min_detectable_mean_score: float | None = Field(
        description="The per-token mean Aaronson score (nats; 1 under H0) at which a text of "
        "this many scored tokens would have been detected at alpha (the whole text's share of "
        "it, and alpha over the readings tried and, for the response, the keys); null when "
        "nothing was scored."
    )
    reference_mean_score: float = Field(
        description="The mean score of a typically watermarked text (1.5) the verdict "
        "compares it to; SmolLM2 at T = 1 averages about 2.6."
    )
    detectable: bool = Field(
        description="A typically watermarked text of this length would have been detected."
    )


class EditTolerantOut(BaseModel):
    """The re-aligned test (with `realign: true`): each position also scored under its labels
    with one of the tokens before it skipped, an exact per-position law, Gamma null."""

    name: Literal["realigned"]
    score: float
    p_value: float
    log10_p_value: float
    method: Literal["exact"]
    num_scored: int
    num_candidates: int = Field(description="(label, token) pairs scored, each label once.")
    plain_weight: float = Field(description="The plain label's share of a position's weight.")
    keys_corrected_p_value: float | None = Field(
        default=None,
        description="min(1, K·p): corrected for the K = `num_keys` · `readings_tried` pairs "
        "(the keys are ranked by the verdict's p, which shares this test's plain pivots, "
        "so a key's own p is not valid for 'one of these keys'; this one is).",
    )
    keys_corrected_log10_p_value: float | None = None


class EntropyWeightedOut(BaseModel):
    """The entropy-weighted test (with `entropy_weighting: true`): S_w = Σ w_t·(−ln(1 − r_t))
    with key-independent weights from the target's entropy; under H0 an exact weighted sum
    of Exp(1)."""

    name: Literal["entropy_weighted"]
    score: float
    p_value: float
    log10_p_value: float
    method: Literal["exact", "chernoff_bound"] = Field(
        description="`exact`: the mixture series (exact to ~1e-10 relative, a valid upper "
        "bound); `chernoff_bound`: a valid upper bound (very long texts, p < 1e-282)."
    )
    num_scored: int
    num_weighted: int = Field(description="Scored positions with a weight above 0.")
    weight_sum: float = Field(description="Σ w_t, the score's mean under H0.")
    weighting: dict[str, float | int | str] | None = Field(
        description="The weight rule (`detector.weighted.ENTROPY_WEIGHTING`)."
    )
    keys_corrected_p_value: float | None = Field(
        default=None, description="min(1, K·p) for the K = `num_keys` · `readings_tried` pairs."
    )
    keys_corrected_log10_p_value: float | None = None


class EditFilteredOut(BaseModel):
    """The edit-filtered test (with `edit_filter: true`): the Aaronson sum over the scored
    positions whose label window holds no token the target ranks past `max_rank`; under H0
    the kept terms are i.i.d. Exp(1), so p is the exact Gamma tail."""

    name: Literal["edit_filtered"]
    score: float
    p_value: float
    log10_p_value: float
    method: Literal["exact"] = Field(
        description="Always `exact`: the Gamma(K, 1) tail for the K kept positions."
    )
    num_scored: int
    num_weighted: int = Field(description="Scored positions kept (not filtered out).")
    weight_sum: float = Field(description="Positions kept: the score's mean under H0.")
    weighting: dict[str, float | int | str] = Field(
        description="The filter (`detector.weighted.RANK_FILTER`)."
    )
    keys_corrected_p_value: float | None = Field(
        default=None, description="min(1, K·p) for the K = `num_keys` · `readings_tried` pairs."
    )
    keys_corrected_log10_p_value: float | None = None


class LikelihoodRatioOut(BaseModel):
    """The likelihood-ratio test (with `likelihood_ratio: true`): S = Σ w_t·(−ln r_t) with
    key-independent weights w_t = 1/max(p_t, floor) − 1 from the target's probability of the
    text's own token; p = P(S' <= S) under H0, an exact weighted sum of Exp(1)."""

    name: Literal["likelihood_ratio"]
    score: float = Field(description="S (nats); small is evidence of the watermark.")
    p_value: float
    log10_p_value: float
    method: Literal["exact", "chernoff_bound"] = Field(
        description="`exact`: the mixture series (exact to ~1e-10 relative, a valid upper "
        "bound); `chernoff_bound`: a valid, conservative upper bound (more than 16 distinct "
        "weights, more than 2,048 series terms, or p < 1e-282: most texts past a few dozen "
        "scored tokens)."
    )
    num_scored: int
    num_weighted: int = Field(description="Scored positions with a weight above 0.")
    weight_sum: float = Field(description="Σ w_t, the score's mean under H0.")
    weighting: dict[str, float | int | str] = Field(
        description="The weight rule (`detector.weighted.LIKELIHOOD_RATIO`)."
    )
    conditioned_on_prompt: bool = Field(
        description="Whether the law came after the item's `prompt`/`messages`."
    )
    keys_corrected_p_value: float | None = Field(
        default=None, description="min(1, K·p) for the K = `num_keys` · `readings_tried` pairs."
    )
    keys_corrected_log10_p_value: float | None = None


class SpanSearchOut(BaseModel):
    windows_scanned: int
    lengths: list[int]
    spans: list[SpanOut]


class ReadingChangesOut(BaseModel):
    """What the canonical reading changed in the submitted text: a sign of tampering."""

    invisible: int = Field(
        description="Invisible characters removed (Unicode Cf and Default_Ignorable kin)."
    )
    spaces: int = Field(description="Space characters read as one plain space.")
    compatibility: int = Field(description="Characters read in their NFKC form.")
    confusables: dict[str, int] = Field(
        description="Letters read as their twin in the word's script, by their own script "
        "(Unicode's name, e.g. `CYRILLIC`)."
    )
    read_as: dict[str, int] = Field(description="The same letters, by the script read as.")
    summary: list[str] = Field(
        description="The changes in words, e.g. `41 invisible characters removed`."
    )


class ReadingOut(BaseModel):
    """Which reading of the text carried the evidence (docs/design.md §4, Readings)."""

    name: Literal["raw", "canonical"] = Field(
        description="`raw`: the text as submitted; `canonical`: invisible characters removed, "
        "Unicode spaces, compatibility forms and cross-script look-alike letters read plainly."
    )
    readings_tried: int = Field(
        description="1 or 2: every p-value of the response is corrected for it."
    )
    changes: ReadingChangesOut


class KeyDetectionOut(BaseModel):
    """One key's result, uncorrected for the number of keys (corrected for the readings
    tried, `reading.readings_tried`)."""

    key_id: str
    verdict: Verdict
    alpha: float
    num_tokens: int
    num_scored: int
    min_scored_tokens: int
    p_value: float = Field(
        description="The verdict's p for this key (`test`), uncorrected for the keys."
    )
    log10_p_value: float
    test: VerdictTestOut
    power: PowerOut
    edit_tolerant: EditTolerantOut | None = Field(description="With `realign: true`.")
    entropy_weighted: EntropyWeightedOut | None = Field(
        default=None, description="With `entropy_weighting: true`."
    )
    likelihood_ratio: LikelihoodRatioOut | None = Field(
        default=None, description="With `likelihood_ratio: true`."
    )
    edit_filtered: EditFilteredOut | None = Field(
        default=None, description="With `edit_filter: true`."
    )
    scores: dict[str, ScoreOut]
    skipped: dict[str, int]
    retokenization_matches: bool | None
    tokens: list[TokenEvidenceOut] | None = Field(
        description="With `evidence: true`, in the best key's result only."
    )
    spans: SpanSearchOut | None = Field(description="With `spans: true`.")


class DetectResponse(BaseModel):
    """The verdict at ``alpha`` on the best key's p-value corrected for ``num_keys`` keys and
    the readings tried; the p is the verdict's test, whole text and spans together (``test``
    of each result)."""

    verdict: Verdict
    alpha: float
    best_key_id: str
    num_keys: int
    reading: ReadingOut | None = Field(
        default=None,
        description="Which reading of `text` carried the evidence and what the canonical "
        "reading changed; null for `token_ids` (scored as given).",
    )
    p_value: float = Field(
        description="min(1, num_keys · readings_tried · the best key's verdict p): whole "
        "text and spans."
    )
    log10_p_value: float
    whole_text_p_value: float = Field(
        description="The smallest plain whole-text Aaronson p of any key (not always the best "
        "key's), corrected for the keys and readings: min(1, K · min p_whole)."
    )
    whole_text_log10_p_value: float
    span_p_value: float | None = Field(
        description="The best window of any key, corrected for the windows, keys and readings; "
        "null below 16 scored tokens."
    )
    span_log10_p_value: float | None
    power: PowerOut
    entropy_weighted_p_value: float | None = Field(
        default=None,
        description="With `entropy_weighting: true`: min(1, K · the smallest "
        "entropy-weighted p of the keys in `results`), valid for 'one of the keys' (beside the "
        "verdict, not used by it).",
    )
    entropy_weighted_log10_p_value: float | None = None
    likelihood_ratio_p_value: float | None = Field(
        default=None,
        description="With `likelihood_ratio: true`: min(1, K · the smallest "
        "likelihood-ratio p of the keys in `results`), valid for 'one of the keys' (beside the "
        "verdict, not used by it).",
    )
    likelihood_ratio_log10_p_value: float | None = None
    edit_filtered_p_value: float | None = Field(
        default=None,
        description="With `edit_filter: true`: min(1, K · the smallest edit-filtered "
        "p of the keys in `results`), valid for 'one of the keys' (beside the verdict, not "
        "used by it).",
    )
    edit_filtered_log10_p_value: float | None = None
    min_scored_tokens: int = Field(
        description="Scored tokens a typical watermarked text needs to reach alpha / K "
        "(below it, a result that is not significant is `insufficient_evidence`)."
    )
    results: list[KeyDetectionOut] = Field(
        description="The own results of the best `max_results` keys, best first, uncorrected "
        "for the keys."
    )


class DetectBatchResponse(BaseModel):
    results: list[DetectResponse]
