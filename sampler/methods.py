"""The sampling methods: one table (``METHODS``) every other place derives from, and the
``SamplerConfig`` that picks a row of it (docs/design.md §3, Methods).

Each row says whether the method drafts (speculative), whether its output carries the keyed
watermark, whether its keyed source gets an ephemeral secret (``*-nowm``), whether B is forced
to 1, whether ``POST /v1/generate`` serves it, and which policy (``sampler.policies``,
``sampler.baselines``) draws its drafts and target tokens in the one step loop
(``sampler.loop``). The policies are imported when a request asks for one, so the table (and
the CLI's help that lists it) imports without torch.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, TypeAlias

from keyed import KeyedSource, Secret
from sampler.processing_config import Processing

if TYPE_CHECKING:
    from sampler.policies import Policy

Method: TypeAlias = Literal[
    "ar", "basic-uwm", "pfr", "mpfr", "pfr-nowm", "mpfr-nowm", "vsps", "gls"
]
MAX_DRAFTS = 64
MAX_LOOKAHEAD = 32


@dataclass(frozen=True)
class MethodSpec:
    """One row of ``METHODS``; the flags default to False.

    Attributes:
        summary: one line for help texts.
        policy: (keyed source, vocabulary size) -> the request's policy.
        speculative: drafts a tree each step (needs a drafter); otherwise one token a step.
        watermarked: the output carries the keyed signal (when the temperature is above 0).
        ephemeral_key: the keyed race runs under a fresh random secret (same law, no signal).
        single_draft: B is forced to 1.
        http: ``POST /v1/generate`` serves it.
    """

    summary: str
    policy: Callable[[KeyedSource, int], Policy] = field(repr=False)
    speculative: bool = False
    watermarked: bool = False
    ephemeral_key: bool = False
    single_draft: bool = False
    http: bool = False

    def policy_for(self, source: KeyedSource, vocab: int) -> Policy:
        """The policy of one request (an ephemeral secret first where the row says so)."""
        if self.ephemeral_key:
            secret = Secret(secrets.token_bytes(32))
            source = KeyedSource(secret, source.context_width, source.masking, source.nonce)
        return self.policy(source, vocab)


# The policies import torch: each is imported by the request that needs it (module docstring).


def _keyed(source: KeyedSource, vocab: int) -> Policy:
    from sampler.policies import KeyedRace

    return KeyedRace(source)


def _multinomial(source: KeyedSource, vocab: int) -> Policy:
    from sampler.policies import Multinomial

    return Multinomial(source.nonce)


def _vsps(source: KeyedSource, vocab: int) -> Policy:
    from sampler.baselines import Vsps

    return Vsps(source.nonce, vocab)


def _gls(source: KeyedSource, vocab: int) -> Policy:
    from sampler.baselines import Gls

    return Gls(source.nonce, vocab)


METHODS: dict[Method, MethodSpec] = {
    "ar": MethodSpec("plain multinomial sampling, seeded by the nonce", _multinomial, http=True),
    "basic-uwm": MethodSpec("autoregressive keyed race", _keyed, watermarked=True, http=True),
    "pfr": MethodSpec(
        "speculative keyed race with one draft (B = 1)",
        _keyed, speculative=True, watermarked=True, single_draft=True, http=True,
    ),
    "mpfr": MethodSpec(
        "multi-draft speculative keyed race (MPFR)",
        _keyed, speculative=True, watermarked=True, http=True,
    ),
    "pfr-nowm": MethodSpec(
        "pfr under an ephemeral key (same law, no watermark)",
        _keyed, speculative=True, ephemeral_key=True, single_draft=True, http=True,
    ),
    "mpfr-nowm": MethodSpec(
        "mpfr under an ephemeral key (same law, no watermark)",
        _keyed, speculative=True, ephemeral_key=True, http=True,
    ),
    "vsps": MethodSpec(
        "speculative rejection sampling, one draft chain (baseline, no watermark)",
        _vsps, speculative=True, single_draft=True,
    ),
    "gls": MethodSpec(
        "list-level Gumbel coupling of B drafts (baseline, no watermark)",
        _gls, speculative=True,
    ),
}  # fmt: skip
"""Every sampling method, in the order help texts and the HTTP schema list them."""

HTTP_METHODS: tuple[Method, ...] = tuple(m for m, spec in METHODS.items() if spec.http)
"""The methods ``POST /v1/generate`` serves, in table order (the schema's enum)."""


def parse_method(name: str) -> Method:
    """``name`` as a ``Method`` (for a name from a command line or a file).

    Raises:
        ValueError: ``name`` is not a key of ``METHODS``, listing them.
    """
    for method in METHODS:
        if method == name:
            return method
    raise ValueError(f"method must be one of {', '.join(METHODS)}; got {name!r}")


TreeMode = Literal["fixed", "auto"]
TREE_MODES: tuple[TreeMode, ...] = ("fixed", "auto")
DEFAULT_TREE: TreeMode = "auto"
"""The CLI's and HTTP API's default ``tree`` (``SamplerConfig`` itself defaults to "fixed":
the same tokens, trees that tests can count)."""


@dataclass(frozen=True)
class SamplerConfig:
    """What to sample and how.

    Attributes:
        method: a key of ``METHODS``.
        drafts: B >= 1 (forced to 1 by single-draft methods; ignored by non-speculative ones).
        lookahead: L >= 1 (ignored by non-speculative methods).
        max_new_tokens: N >= 1.
        processing: temperature, top-k, top-p.
        tree: ``"fixed"``: every step drafts B drafts of depth L; ``"auto"``: a keyed-race
            method (mpfr, pfr) picks B <= drafts and ℓ <= lookahead (ℓ = 0: a one-token step)
            per step by the cost model of ``sampler.autotree`` — the same tokens (MPFR paper
            Thm. 5.1), faster where trees do not pay; other methods draft as ``"fixed"``.
    Raises:
        ValueError: at construction, naming the field and the limit.
    """

    method: Method = "mpfr"
    drafts: int = 4
    lookahead: int = 4
    max_new_tokens: int = 128
    processing: Processing = field(default_factory=Processing)
    tree: TreeMode = "fixed"

    def __post_init__(self) -> None:
        parse_method(self.method)
        if self.tree not in TREE_MODES:
            raise ValueError(f"tree must be one of {', '.join(TREE_MODES)}, got {self.tree!r}")
        if not 1 <= self.drafts <= MAX_DRAFTS:
            raise ValueError(f"drafts must be in [1, {MAX_DRAFTS}], got {self.drafts}")
        if not 1 <= self.lookahead <= MAX_LOOKAHEAD:
            raise ValueError(f"lookahead must be in [1, {MAX_LOOKAHEAD}], got {self.lookahead}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    @property
    def spec(self) -> MethodSpec:
        return METHODS[self.method]

    @property
    def speculative(self) -> bool:
        return self.spec.speculative

    @property
    def effective_drafts(self) -> int:
        return 1 if self.spec.single_draft else self.drafts

    @property
    def effective_lookahead(self) -> int:
        """L, or 0 for a method that does not draft."""
        return self.lookahead if self.spec.speculative else 0
