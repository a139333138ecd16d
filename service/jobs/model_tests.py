"""The detection tests that read the target's law (``detector.weighted``): entropy-weighted,
likelihood-ratio and edit-filtered, for the HTTP routes and ``poissonmark detect`` alike.

The law at every position of the text (``sampler.entropy.position_laws``: one causal forward of
the target over the ids, after the generation's chat-templated prompt when the caller gives it,
else after the tokenizer's BOS when it has one) is computed once per reading the detailed keys
were read through (it does not depend on the key; one or two) and weighs each detailed key's
scored positions. ``service.jobs.detect_response`` puts each
key's result beside its own, with its p times K (the keys are ranked by the verdict's p), and
at the top K times the smallest of them (a subset of the keys: still valid for "one of the K
keys").

Shapes: T tokens of the text; entropy, token log-probability and raw rank (T,) float32 /
float32 / int64 from the law, read as NumPy; per key the skip codes (T,) int8 and the Aaronson
terms (M,) float64 of its M scored positions (``detector.evidence.TokenColumns``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from detector.evidence import Detection
from detector.multikey import MultiKeyDetection
from service.errors import InvalidInput
from service.schemas.detect import DetectOptions

MODEL_TESTS = (
    ("entropy_weighted", "entropy_weighting"),
    ("likelihood_ratio", "likelihood_ratio"),
    ("edit_filtered", "edit_filter"),
)
"""(result name, request field) of each test that reads the model, in response order."""


@dataclass(frozen=True)
class ModelTests:
    """The tests that ran: ``results[name]`` holds one test's wire shape
    (``EntropyWeightedOut``, ``LikelihoodRatioOut``, ``EditFilteredOut``, uncorrected for the
    keys) per detailed key, in the order of ``MultiKeyDetection.results``."""

    results: dict[str, list[dict[str, Any]]]


def run_model_tests(
    found: MultiKeyDetection,
    model: Any,
    processing: Any,
    *,
    entropy_weighting: bool = False,
    likelihood_ratio: bool = False,
    edit_filter: bool = False,
    prompt_ids: Sequence[int] | None = None,
    prompt_field: str = "prompt",
) -> ModelTests | None:
    """Run the asked tests over every detailed key of ``found`` (module docstring).

    Args:
        found: the detector's result (each detailed key's evidence holds its reading's ids).
        model: the target (``LoadedModel.target``). processing: a ``sampler.processing.
            Processing`` (the generation's temperature, top-k, top-p).
        entropy_weighting, likelihood_ratio, edit_filter: which tests (none: None).
        prompt_ids: the generation's prompt as the model saw it (``chat_prompt_ids``), or None.
        prompt_field: the request field the prompt came from (``prompt`` or ``messages``).
    Raises:
        InvalidInput: ``prompt_field`` (with a prompt) or the test's field: the prompt and the
            text are longer than the model's positions.
    """
    on = {"entropy_weighting": entropy_weighting, "likelihood_ratio": likelihood_ratio}
    on["edit_filter"] = edit_filter
    asked = [(name, field) for name, field in MODEL_TESTS if on[field]]
    if not asked:
        return None
    from detector.weighted import (
        entropy_weighted_test,
        likelihood_ratio_test,
        rank_filtered_test,
    )
    from sampler.entropy import position_laws  # torch: only when asked for

    texts = {tuple(d.evidence.ids.tolist()) for d in found.results.values()}  # a key's reading
    longest = max(len(ids) for ids in texts)
    if prompt_ids is None:
        bos = getattr(model.config, "bos_token_id", None)
        prefix = [int(bos)] if isinstance(bos, int) else []
    else:
        prefix = [int(t) for t in prompt_ids]
    limit = getattr(model.config, "max_position_embeddings", None)
    if isinstance(limit, int) and len(prefix) + longest > limit:
        field = prompt_field if prompt_ids is not None else asked[0][1]
        raise InvalidInput(
            field,
            f"expected the prompt and the text within {limit} tokens (the model's positions), "
            f"got {len(prefix)} + {longest}",
        )
    conditioned = prompt_ids is not None
    laws = {ids: position_laws(model, list(ids), processing, prefix=prefix) for ids in texts}

    def run(name: str, detection: Detection) -> dict[str, Any]:
        law = laws[tuple(detection.evidence.ids.tolist())]  # (T,) columns of the key's reading
        skip, terms = detection.evidence.skip, detection.evidence.terms["aaronson"]
        if name == "entropy_weighted":
            return entropy_weighted_test(skip, terms, law.entropy.numpy()).to_json()
        if name == "edit_filtered":
            assert detection.context_width is not None, "detect() sets it"
            rank = law.raw_rank.numpy()
            return rank_filtered_test(skip, terms, rank, detection.context_width).to_json()
        logp = law.token_logp.numpy()
        return likelihood_ratio_test(skip, terms, logp, conditioned_on_prompt=conditioned).to_json()

    readings = found.num_readings
    return ModelTests(
        {
            name: [_for_readings(run(name, d), readings) for d in found.results.values()]
            for name, _ in asked
        }
    )


def _for_readings(result: dict[str, Any], readings: int) -> dict[str, Any]:
    """A test's p times the R readings of the text tried (the reading it runs on was chosen
    on the verdict's p, ``detector.readings``), capped at 1."""
    if readings == 1:
        return result
    log10 = min(0.0, float(result["log10_p_value"]) + math.log10(readings))
    return result | {"log10_p_value": log10, "p_value": 10.0**log10}


def request_processing(options: DetectOptions) -> Any:
    """The ``sampler.processing.Processing`` of a request's ``processing`` (its defaults when
    omitted)."""
    from sampler.processing_config import Processing  # no torch

    given = options.processing
    if given is None:
        return Processing()
    return Processing(given.temperature, given.top_k, given.top_p)
