"""A drafter from its spec: ``model:PATH``, ``self:N``, ``heads[:PATH]``, ``eagle[:PATH]``,
``ngram``, ``fixed:TOKEN`` (``sampler.drafters.base`` says what each is), and the default one.
"""

from __future__ import annotations

from pathlib import Path

from transformers import PreTrainedModel

from sampler.drafters.base import (
    Drafter,
    FixedTokenDrafter,
    NgramDrafter,
    model_drafter,
    self_drafter,
)
from sampler.drafters.eagle import eagle_drafter
from sampler.drafters.heads import heads_drafter
from sampler.targets.base import Target
from sampler.targets.transformers import as_target


def default_drafter(target: Target | PreTrainedModel, data_dir: Path | None = None) -> Drafter:
    """The drafter a speculative request gets when it names none (its spec: ``.name``):
    ``eagle`` (the head trained for ``target`` in ``data_dir``, else the shipped head,
    ``sampler.drafters.eagle.eagle_drafter``) where one fits ``target`` and the backend gives
    hidden states, else ``ngram``. With tree ``auto`` the cost model still steps one token at a
    time where trees do not pay (``sampler.autotree``)."""
    try:
        return eagle_drafter("", target, data_dir)
    except ValueError:
        return NgramDrafter(as_target(target).vocab_size)


def make_drafter(
    spec: str, target: Target | PreTrainedModel, data_dir: Path | None = None
) -> Drafter:
    """Build a drafter from its spec: ``model:PATH``, ``self:N``, ``heads[:PATH]``,
    ``eagle[:PATH]``, ``ngram``, ``fixed:TOKEN``; ``heads`` and ``eagle`` without a path are
    the ones trained for ``target`` in ``data_dir`` where there are, else the shipped ones.

    Raises:
        ValueError: an unknown spec, naming the accepted forms; a drafter on the target's
            features (``heads``, ``eagle``) on a backend without hidden states.
    """
    served = as_target(target)
    vocab = served.vocab_size
    kind, _, arg = spec.partition(":")
    try:
        if kind == "self" and arg:
            return self_drafter(served.model, int(arg))
        if kind == "model" and arg:
            return model_drafter(arg, served.model)
        if kind == "heads":
            return heads_drafter(arg, target, data_dir)
        if kind == "eagle":
            return eagle_drafter(arg, target, data_dir)
        if kind == "ngram" and not arg:
            return NgramDrafter(vocab)
        if kind == "fixed" and arg:
            return FixedTokenDrafter(vocab, int(arg))
    except ValueError as exc:
        raise ValueError(f"drafter {spec!r}: {exc}") from None
    raise ValueError(
        f"unknown drafter {spec!r}: expected model:PATH, self:N, heads[:PATH], eagle[:PATH], "
        "ngram or fixed:TOKEN"
    )
