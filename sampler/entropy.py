"""The target's entropy at every position of a text, under the generation's processing.

For entropy-aware detection (``detector.weighted``): the detector weighs each
scored position by a function of H_t, the Shannon entropy (nats) of the *processed* target law
(temperature -> top-k -> top-p, ``sampler.processing.process``, the law the keyed race samples)
of token t given the tokens before it. The weights must not depend on the key; these do not
(a model forward over the text only), so the weighted null stays exact.

The detector sees the text, not the prompt: position t is conditioned on ``prefix`` (e.g. the
tokenizer's BOS, or nothing) and ids[:t]. Without a prefix position 0 has no context and its
entropy is reported as 0.0 (no weight). Shapes: T tokens, V vocabulary, C rows per chunk.

The logits come from the backend the model serves generation with
(``targets.transformers.open_cache``: llama.cpp for precision gguf, the row-invariant bfloat16
runner, or transformers), so the law read here is the one the keyed race sampled from, not a float32
approximation of it.

Cost (measured in ``bench/results/detector_entropy.json``, ``entropy_cpu``): one causal forward
of the model over the text plus the processing of T rows of V logits in float64.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import torch
from transformers import PreTrainedModel

from sampler.processing import Processing, process
from sampler.targets.base import Target
from sampler.targets.transformers import as_target

DEFAULT_CHUNK: Final = 128
"""Tokens per forward: the KV cache carries the context from chunk to chunk (one causal pass)."""


def support_entropy(logp: torch.Tensor) -> torch.Tensor:
    """Shannon entropy of each row of log-probabilities.

    Args:
        logp: (N, K) float64 log-probabilities, -inf outside the support (``Support.logp``).
    Returns:
        (N,) float64 nats, >= 0; 0.0 for a row with one token or none.
    """
    p = logp.exp()
    terms = torch.where(p > 0.0, -p * logp, torch.zeros_like(p))
    return terms.sum(dim=-1).clamp_min(0.0)


@dataclass(frozen=True)
class PositionLaws:
    """What the target's law says about every position of a text (T tokens), key-independent.

    Attributes:
        entropy: (T,) float64 nats, H of the processed law of token t given what precedes it.
        token_logp: (T,) float64 ln of the processed probability of the token the text has at
            t (-inf: outside the processed support, e.g. past top-k or top-p).
        raw_rank: (T,) int64 rank of that token in the *raw* (untempered, unfiltered) law:
            how many tokens have a strictly larger logit (0: the most likely).
    Entries at position 0 without a prefix (no context) are 0.0, 0.0 and 0.
    """

    entropy: torch.Tensor
    token_logp: torch.Tensor
    raw_rank: torch.Tensor


@torch.inference_mode()
def position_laws(
    model: Target | PreTrainedModel,
    ids: Sequence[int],
    processing: Processing,
    *,
    prefix: Sequence[int] = (),
    chunk: int = DEFAULT_CHUNK,
) -> PositionLaws:
    """The processed entropy, the processed log-probability of the text's own token and its
    raw rank at every position of ``ids``, from one causal forward (chunked over the KV cache).

    Args:
        model: the target (``sampler.targets.base.Target``; a bare transformers model: its own
            forward), read through its generation backend; logits are processed in float64.
        ids: (T,) token ids of the text, as the detector tokenized it.
        processing: the generation's temperature, top-k, top-p; T = 0 (greedy): entropy 0.0,
            ``token_logp`` 0.0 for the arg-max token and -inf for any other.
        prefix: ids conditioned on before the text (not reported), e.g. ``[bos]``; may be
            empty.
        chunk: tokens per forward, >= 1 (at most the backend's ``rows_per_call``). Texts
            longer than the model's
            ``max_position_embeddings`` (with the prefix) are refused.
    Returns:
        ``PositionLaws`` of (T,) CPU tensors (their docstring).
    Raises:
        ValueError: chunk < 1; an id outside the model's vocabulary; the text too long for the
            model's positions.
    """
    if chunk < 1:
        raise ValueError(f"expected chunk >= 1, got {chunk}")
    target = as_target(model)
    model = target.model
    vocab = int(model.config.vocab_size)
    tokens = [int(t) for t in prefix] + [int(t) for t in ids]
    for i, t in enumerate(tokens):
        if not 0 <= t < vocab:
            raise ValueError(f"expected ids in [0, {vocab}), got {t} at position {i}")
    limit = getattr(model.config, "max_position_embeddings", None)
    if isinstance(limit, int) and len(tokens) > limit:
        raise ValueError(
            f"expected at most {limit} tokens (prefix and text) for this model, got {len(tokens)}"
        )
    entropy = torch.zeros(len(ids), dtype=torch.float64)
    token_logp = torch.zeros(len(ids), dtype=torch.float64)
    raw_rank = torch.zeros(len(ids), dtype=torch.int64)
    if not ids:
        return PositionLaws(entropy, token_logp, raw_rank)
    device = target.device
    lm = target.new_cache()  # the generation's backend: its law, not a float32 copy of it
    if target.rows_per_call is not None:
        chunk = min(chunk, target.rows_per_call)
    # The logits after token j predict token j + 1: text position t comes from tokens index
    # len(prefix) + t - 1. Only the text's last token needs no forward.
    inputs = tokens[:-1]
    first = len(prefix) - 1  # index in ``inputs`` whose logits predict text position 0
    for start in range(0, len(inputs), chunk):
        piece = inputs[start : start + chunk]
        logits = lm.extend(piece).to(device)  # (C, V)
        rows = torch.arange(start, start + len(piece))  # (C,) indices into inputs
        keep = rows >= first
        if not bool(keep.any()):
            continue
        kept = logits[keep.to(device)]  # (C', V)
        at = (rows[keep] - first).tolist()  # text positions
        observed = torch.tensor([tokens[r + 1] for r in rows[keep].tolist()], device=device)
        own = kept.gather(1, observed[:, None])  # (C', 1) the text token's raw logit
        raw_rank[at] = (kept > own).sum(dim=-1).cpu()
        support = process(kept, processing)
        if not processing.greedy:
            entropy[at] = support_entropy(support.logp).cpu()
        hit = support.tokens == observed[:, None]  # (C', K): at most one slot per row
        logp = torch.where(hit, support.logp, torch.full_like(support.logp, -math.inf))
        token_logp[at] = logp.max(dim=-1).values.cpu()
    return PositionLaws(entropy, token_logp, raw_rank)


def processed_entropy(
    model: Target | PreTrainedModel,
    ids: Sequence[int],
    processing: Processing,
    *,
    prefix: Sequence[int] = (),
    chunk: int = DEFAULT_CHUNK,
) -> torch.Tensor:
    """The entropy of the processed target law at every position of ``ids``.

    Args:
        as ``position_laws``.
    Returns:
        (T,) float64 nats on the CPU: entry t is H(processed law of token t | prefix, ids[:t]);
        entry 0 is 0.0 when ``prefix`` is empty; 0.0 everywhere when T = 0 (greedy).
    Raises:
        ValueError: as ``position_laws``.
    """
    if processing.greedy and chunk >= 1:  # H = 0 everywhere: no forward needed
        return torch.zeros(len(ids), dtype=torch.float64)
    return position_laws(model, ids, processing, prefix=prefix, chunk=chunk).entropy
