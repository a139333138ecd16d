"""The speculative decoder: keyed multi-draft speculative sampling (MPFR paper Alg. 7 / Alg. 10).

Glossary:
- target P_k / drafter Q_k: processed next-token laws (``sampler.processing``).
- draft tree: contexts reachable by the B drafts within ℓ = min(L, N − n) tokens; each occupied
  context c with multiplicity ν(c) draws ν(c) drafts by MPFR(Q_k(·|c), Π(c), ν(c)).
- accepted: the target's keyed race winner y(c*) is one of the drafted children D(c*).
- bonus token: after ℓ accepted levels, the target's winner at the leaf context.
- clock: Exp(1) increments from the keyed source Π(c) (``keyed``), shared by draft and target.

Every emitted token is the target's keyed race winner at its own context, so the output is a
function of (key, nonce, prompt, target) only: identical to autoregressive keyed sampling
(``basic-uwm``) for every drafter, B and L (stopping-time drafter invariance, Prop. 4.4 /
Prop. C.3; exactness of the law, Thm. A.6).

One step = ℓ drafter calls (one per tree level) + ONE target forward over the whole tree
(``sampler.loop``); what each method draws is its row of ``sampler.methods.METHODS`` and that
row's policy (``sampler.policies``, ``sampler.baselines``).
"""

from __future__ import annotations

from collections.abc import Callable

from transformers import PreTrainedModel

from keyed import KeyedSource
from sampler.drafters import Drafter
from sampler.loop import result, start, step
from sampler.methods import MAX_DRAFTS, MAX_LOOKAHEAD, METHODS, Method, SamplerConfig
from sampler.stats import GenerationResult, GenerationStats
from sampler.targets.base import Target
from sampler.targets.transformers import as_target

__all__ = [
    "MAX_DRAFTS",
    "MAX_LOOKAHEAD",
    "METHODS",
    "GenerationResult",
    "GenerationStats",
    "Method",
    "SamplerConfig",
    "generate",
]


def generate(
    target: Target | PreTrainedModel,
    prompt: list[int],
    config: SamplerConfig,
    source: KeyedSource | None = None,
    drafter: Drafter | None = None,
    eos_ids: frozenset[int] = frozenset(),
    on_tokens: Callable[[list[int]], None] | None = None,
) -> GenerationResult:
    """Sample a completion of ``prompt`` from the target (MPFR paper Alg. 7 / Alg. 10).

    Args:
        target: the target (``sampler.targets.base.Target``, e.g. ``LoadedModel.target``); a bare
            transformers causal LM (eval mode) runs on transformers' own forward.
        prompt: the prompt's token ids (at least one).
        config: method, B, L, N and the logit processing.
        source: the keyed source (secret, context width, masking, nonce) for keyed methods;
            ``*-nowm`` methods replace its secret by an ephemeral one; ``ar``, ``vsps`` and
            ``gls`` use its nonce as the seed of their ``torch.Generator``.
        drafter: required for speculative methods (ignored by the others).
        eos_ids: tokens that end the completion (not included in the result).
        on_tokens: called after every step with the ids that step emitted, in order (EOS
            excluded, so the last call may get ``[]``); the calls concatenate to the result's
            ``token_ids``. For streaming; an exception it raises stops generation and propagates
            (e.g. to cancel a request).
    Returns:
        ``GenerationResult`` with the completion ids (no prompt), stats and
        ``watermark_applied`` (False for unwatermarked methods and temperature 0).
    Raises:
        ValueError: empty prompt, ids outside the vocabulary, missing source or drafter.
    """
    vocab = as_target(target).vocab_size
    if not prompt:
        raise ValueError("prompt must contain at least one token")
    if min(prompt) < 0 or max(prompt) >= vocab:
        raise ValueError(f"prompt ids must be in [0, {vocab})")
    if source is None:
        raise ValueError("a keyed source (key or nonce) is required")
    if config.speculative and drafter is None:
        raise ValueError(f"method {config.method!r} needs a drafter")
    seq = start(target, prompt, config, source, drafter, eos_ids)
    while not seq.done:
        emitted = step(seq)
        if on_tokens is not None:
            on_tokens(emitted)
    return result(seq)
