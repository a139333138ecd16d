"""The target interface: what the decoder, batching, tree ``auto`` and the detector's model
tests need of a target, whatever runs it.

One ``Target`` object per loaded target (``sampler.models.load_model`` returns it as
``LoadedModel.target``). The backends that implement it:

- ``sampler.targets.transformers.TransformersTarget``: transformers' own forward (the float64
reference,
  float32 on the CPU, any precision on CUDA);
- ``sampler.targets.cpu_bf16.InvariantLlama``: the row-invariant bfloat16 CPU runner;
- ``sampler.targets.llamacpp.GgufTarget``: llama.cpp on the model's GGUF file;
- ``sampler.targets.static.StaticLlama``: the static-layout target (CUDA graphs; eager on the
  CPU).

A sequence's KV cache (``new_cache``, a ``TargetLM``) takes ``forward``/``extend``/``keep``;
``Target.forward`` runs many sequences' trees in one call.

Shapes: S sequences of a forward, q_s new tokens and P_s cached positions of sequence s, V
vocabulary, d hidden size. Per sequence: tokens and depths q_s ints, visible (q_s, P_s + q_s)
bool, logits out (q_s, V) float32 or better; ``last_hidden`` (q, d); ``project`` (n, d)
features -> (n, V) logits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch
from transformers import PreTrainedModel

from sampler.targets.masks import chain_visible

__all__ = ["Target", "TargetLM"]


class TargetLM(Protocol):
    """A sequence on a target with its KV cache (``Target.new_cache``): transformers'
    (``sampler.targets.transformers.CachedLM``), the row-invariant runner's, llama.cpp's or the
    static layout's.

    Attributes:
        cached: P, the positions in the cache.
        forward_calls: the backend's forwards for this sequence so far (prefill included).
        keep_hidden: when set, ``forward``/``extend`` fill ``last_hidden`` (the target's
            ``gives_hidden``).
        last_hidden: (q, d) final normed hidden states of the latest forward, or None.
    """

    cached: int
    forward_calls: int
    keep_hidden: bool
    last_hidden: torch.Tensor | None

    @property
    def target(self) -> Target:
        """The target this cache runs on."""
        ...

    def forward(
        self, tokens: list[int], depths: list[int], visible: torch.Tensor, base: int
    ) -> torch.Tensor:
        """(q, V) logits of q new tokens at position ids ``base + depths``, each attending to
        the cached and new positions ``visible`` (q, P + q) marks; they join the cache."""
        ...

    def extend(self, tokens: list[int]) -> torch.Tensor:
        """``forward`` over a chain of tokens (each sees all before it): (q, V) logits."""
        ...

    def keep(self, prefix: int, slots: list[int]) -> None:
        """Keep the first ``prefix`` positions and the tree positions ``slots`` (in order);
        drop the rest."""
        ...


class Target:
    """A loaded target (module docstring). Subclasses set ``model`` and implement
    ``new_cache``, ``forward`` and ``backend``.

    Attributes:
        model: the transformers model of the same weights: its config, tokenizer-facing
            settings, and the layers drafters share (self-drafting, heads).
        vocab_size: V, the logits' width.
        invariant: whether a context's logits are the same bits whatever the tree or batch
            around it (tree ``auto`` chooses trees only then; drafter and batch invariance
            of the output rest on it).
        gives_hidden: whether its caches fill ``last_hidden`` (the latest forward's (q, d)
            final normed hidden states) when ``keep_hidden`` is set; drafters on the target's
            features (``heads``, ``eagle``) need it.
        rows_per_call: the most new tokens one forward should carry for a single sequence
            (None: no limit); the detector's model tests chunk by it.
        profile_dir: where tree ``auto``'s forward-cost profile is kept on disk.
        forward_profile: the profile once measured or read (``sampler.targets.profile``).
    """

    model: PreTrainedModel
    vocab_size: int
    invariant: bool = False
    gives_hidden: bool = True
    rows_per_call: int | None = None
    profile_dir: Path | None = None
    forward_profile: Any = None

    @property
    def config(self) -> Any:
        """The model's transformers config."""
        return self.model.config

    @property
    def device(self) -> torch.device:
        """The device of the transformers model (and of drafters built on it)."""
        return next(self.model.parameters()).device

    def backend(self) -> str:
        """A short description of what computes the logits (for fingerprints and logs)."""
        raise NotImplementedError

    def new_cache(self) -> TargetLM:
        """An empty KV cache for one sequence."""
        raise NotImplementedError

    def new_batch_cache(self) -> TargetLM:
        """An empty KV cache for a sequence that steps beside others through ``forward``
        (continuous batching). A backend whose caches batch best in a common store (llama.cpp:
        one context) puts it there; the logits are those of ``new_cache``'s."""
        return self.new_cache()

    def forward(
        self,
        caches: list[Any],
        tokens: list[list[int]],
        depths: list[list[int]],
        visible: list[torch.Tensor],
        bases: list[int],
    ) -> list[torch.Tensor]:
        """One forward over S sequences' new tokens, each over its own cache.

        Args:
            caches: S caches of this target.
            tokens: per sequence, q_s token ids.
            depths: per sequence, q_s position offsets (position id = base + depth).
            visible: per sequence, (q_s, P_s + q_s) bool, which cached and new positions each
                new token attends to.
            bases: per sequence, the position id of depth 0.
        Returns:
            S tensors of (q_s, V) logits.
        """
        raise NotImplementedError

    def prefill(self, caches: list[Any], chains: list[list[int]]) -> None:
        """Causal forwards of S chains into S empty caches, the logits unread (a prompt's
        prefill: its last token is the first step's root); hidden states are kept as
        ``forward`` keeps them. By default ``forward``'s logits are dropped; a backend whose
        logits cost a copy (the static target's device-to-host) skips them.

        Args:
            caches: S empty caches of this target (one alone: its own ``forward``).
            chains: per cache, the token ids, each attending to those before it.
        """
        depths = [list(range(len(chain))) for chain in chains]
        visible = [chain_visible(0, len(chain)) for chain in chains]
        if len(caches) == 1:
            caches[0].forward(chains[0], depths[0], visible[0], 0)
        else:
            self.forward(caches, chains, depths, visible, [0] * len(chains))

    def project(self, features: torch.Tensor) -> torch.Tensor | None:
        """The target's final norm and LM head on (n, d) drafter features, through the
        backend's own head where it has one (None: use transformers' head)."""
        return None
