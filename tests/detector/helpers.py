"""Detector test helpers: fixed keys derived from names and a model-free keyed-race generator."""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from keyed import KeyedSource, Secret, label_key
from keyed.tensor import exponential_clocks, keys_tensor


def fixed_secret(name: str) -> Secret:
    """A deterministic 32-byte secret for tests (BLAKE2b of a name; never a real key)."""
    return Secret(hashlib.blake2b(f"poissonmark-test:{name}".encode(), digest_size=32).digest())


def fixed_source(name: str, context_width: int = 4, masking: bool = True) -> KeyedSource:
    """A keyed source under ``fixed_secret(name)``."""
    return KeyedSource(fixed_secret(name), context_width=context_width, masking=masking)


def keyed_race_ids(
    secret: Secret, num_new: int, seed: int, width: int = 4, vocab: int = 49152, support: int = 32
) -> list[int]:
    """A synthetic watermarked id sequence, without a model.

    Starts with ``width`` random ids; each next id is the keyed race winner (docs/design.md §0:
    argmin_u E_{u,1}/P(u), i.e. argmax U^{1/P(u)}) over a random support of ``support`` ids
    (special ids 0-2 excluded) under a random P ~ Dirichlet(1), with the clocks of the label of
    the last ``width`` ids — the autoregressive keyed race (BASIC-UWM) on a random "model".
    """
    rng = np.random.default_rng(seed)
    prefix = [int(t) for t in rng.integers(3, vocab, size=width)]
    return keyed_race_continue(secret, prefix, num_new, rng, width, vocab, support)


def keyed_race_continue(
    secret: Secret,
    prefix: list[int],
    num_new: int,
    rng: np.random.Generator,
    width: int = 4,
    vocab: int = 49152,
    support: int = 32,
    concentration: float = 1.0,
) -> list[int]:
    """``prefix`` followed by ``num_new`` keyed-race winners (as ``keyed_race_ids``).

    P ~ Dirichlet(concentration) over each random support: a smaller concentration gives peakier
    laws, lower entropy and a weaker per-token watermark (mean Aaronson term ~3.6 at
    support 32 and concentration 1; ~2 at concentration 0.1).
    """
    ids = list(prefix)
    for _ in range(num_new):
        candidates = rng.choice(np.arange(3, vocab), size=support, replace=False)  # (K,)
        probs = rng.dirichlet(np.full(support, concentration))  # (K,)
        key = keys_tensor([label_key(secret, tuple(ids[-width:]))])  # (1, 2)
        tokens = torch.from_numpy(candidates[None, :].astype(np.int64))  # (1, K)
        clocks = exponential_clocks(key, tokens, 1)[0, :, 0].numpy()  # (K,)
        ids.append(int(candidates[np.argmin(clocks / np.maximum(probs, 1e-300))]))
    return ids


def repetitive_ids(rng: np.random.Generator, kind: int) -> list[int]:
    """An adversarially repetitive id sequence (kind 0: a short cycle, 1: a few-token
    vocabulary, else a repeated phrase with one varying slot); the H0 texts of
    ``test_realign.py`` and ``bench/detector_robustness.py``."""
    if kind == 0:
        period = int(rng.integers(2, 7))
        return (list(rng.integers(3, 49152, size=period)) * 80)[:300]
    if kind == 1:
        return [int(t) for t in rng.integers(3, 8, size=300)]
    phrase = [int(t) for t in rng.integers(3, 49152, size=6)]
    out: list[int] = []
    for _ in range(40):
        out += [*phrase, int(rng.integers(3, 12))]
    return out


def hypoexponential_log_tail(weights: list[float], s: float, *, lower: bool = False) -> float:
    """ln P(Σ w_i E_i >= s) (or, with ``lower``, <= s) for *distinct* w_i, by the
    partial-fraction closed form of the upper tail Σ_i Π_{j≠i} w_i/(w_i − w_j) e^{−s/w_i}, at
    80 digits (it cancels badly in floats); the weighted tests' reference."""
    import mpmath

    with mpmath.workdps(80):
        w = [mpmath.mpf(x) for x in weights]
        total = mpmath.mpf(0)
        for i, wi in enumerate(w):
            c = mpmath.mpf(1)
            for j, wj in enumerate(w):
                if j != i:
                    c *= wi / (wi - wj)
            total += c * mpmath.exp(-s / wi)
        return float(mpmath.log(1 - total if lower else total))
