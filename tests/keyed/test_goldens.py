"""Frozen PRF vectors (``tests/goldens/prf_v{PRF_VERSION}.json``; policy in its README).

A failure here is a protocol break: do not regenerate the file, find the change in ``keyed/``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from keyed.context import KeyedSource
from keyed.prf import PRF_VERSION, SENTINEL, Secret, label_key, nonce_key, pivot_array
from keyed.tensor import clock_uniforms, keys_tensor, philox4x32_10, uniforms_from_keys
from tests.keyed.reference import pivots
from tests.keyed.test_prf import reference_block

GOLDEN_FILE = Path(__file__).resolve().parents[1] / "goldens" / f"prf_v{PRF_VERSION}.json"
DOC: dict[str, Any] = json.loads(GOLDEN_FILE.read_text())
CASES = [pytest.param(c, id=c["id"]) for c in DOC["cases"]]


def _context_key(case: dict[str, Any]) -> tuple[int, int]:
    secret = Secret(bytes.fromhex(case["secret"]))
    if case["kind"] == "label":
        return label_key(secret, tuple(case["label"]))
    return nonce_key(secret, case["nonce"], case["position"])


def test_golden_file_matches_this_build():
    assert DOC["prf_version"] == PRF_VERSION
    assert DOC["counter"] == "(token, arrival, 0, 0)"


def test_golden_file_covers_the_contract():
    """The frozen cases keep covering the edges the README promises."""
    cases = DOC["cases"]
    labels = [tuple(c["label"]) for c in cases if c["kind"] == "label"]
    secrets = {c["secret"] for c in cases}
    assert len(cases) >= 40
    assert {"00" * 32, "ff" * 32} <= secrets
    assert (0, 0, 0, 0) in labels and (SENTINEL,) * 4 in labels
    assert {len(label) for label in labels} >= {1, 4, 8}
    assert {c["token"] for c in cases} >= {0, 1, 49_151, 2**31}
    assert {c["arrival"] for c in cases} >= set(range(1, 9))
    assert sum(c["kind"] == "nonce" for c in cases) >= 4


@pytest.mark.parametrize("case", CASES)
def test_golden_case(case):
    token, arrival = case["token"], case["arrival"]
    key = _context_key(case)
    assert list(key) == case["key"], "context key changed: protocol break"

    # Philox words, ours and the independent reference
    words = philox4x32_10(
        (torch.tensor(token), torch.tensor(arrival), torch.tensor(0), torch.tensor(0)),
        (torch.tensor(key[0]), torch.tensor(key[1])),
    )
    assert [int(words[0]), int(words[1])] == case["words"], "Philox words changed"
    assert list(reference_block((token, arrival, 0, 0), key)[:2]) == case["words"]

    # U through every public path, bit for bit (exact bits, so float equality is right here)
    expected = float.fromhex(case["u"])
    k = keys_tensor([key])
    direct = uniforms_from_keys(k[:, 0], k[:, 1], torch.tensor([token]), torch.tensor([arrival]))
    assert direct.item() == expected, "U changed: protocol break"
    sampler = clock_uniforms(k, torch.tensor([[token]]), arrival)  # (1, 1, arrival)
    assert sampler[0, 0, arrival - 1].item() == expected
    if arrival == 1:
        assert pivots(k, torch.tensor([token])).item() == expected
        assert pivot_array(np.array([key]), np.array([token])).item() == expected  # the detector


@pytest.mark.parametrize("case", [c for c in CASES if c.values[0]["kind"] == "label"][:10])
def test_golden_keys_through_keyed_source(case):
    """The sampler/detector entry point derives the same keys (first use of a label, and the
    nonce stream for a repeated one)."""
    source = KeyedSource(Secret(bytes.fromhex(case["secret"])), nonce=99)
    label = tuple(case["label"])
    assert list(source.context_key(label, 5, repeated=False)) == case["key"]
    assert list(source.context_key(label, 5, repeated=True)) != case["key"]
