"""The prompt window draws from the nonce stream (docs/design.md §2), on a float64
tiny Llama: the first m response positions, whose labels reach into the prompt, are keyed by
(nonce, position); later positions by their label at first use, exactly the positions the
detector scores; so different nonces give fresh samples and drafters still change nothing."""

from __future__ import annotations

from typing import Any

import pytest

from keyed import KeyedSource, Secret, detection_plan, label_at, label_key, nonce_key
from sampler.decoder import SamplerConfig, generate
from sampler.drafters import self_drafter

SECRET = Secret(bytes(range(32)))
PROMPT = [5, 9, 2]


def spy_keys(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, tuple[int, ...], Any]]:
    """Record every (position, label, key) that ``KeyedSource.context_key`` answers."""
    calls: list[tuple[int, tuple[int, ...], Any]] = []
    original = KeyedSource.context_key

    def recording(self: KeyedSource, label: Any, position: int, repeated: bool) -> Any:
        key = original(self, label, position, repeated)
        calls.append((position, tuple(label), key))
        return key

    monkeypatch.setattr(KeyedSource, "context_key", recording)
    return calls


@pytest.mark.parametrize("width", [pytest.param(w, id=f"m{w}") for w in (1, 2, 4)])
def test_window_is_nonce_keyed_and_the_rest_matches_the_detector(target, monkeypatch, width):
    """basic-uwm, 48 tokens from a 64-token vocabulary (labels repeat at m = 1, 2): position
    t < m draws at nonce_key(secret, nonce, t) and its label holds prompt ids; position t >= m
    at label_key exactly where ``detection_plan`` scores t, else (a repeat) at the nonce key."""
    calls = spy_keys(monkeypatch)
    source = KeyedSource(SECRET, width, True, nonce=31)
    out = generate(target, PROMPT, SamplerConfig("basic-uwm", max_new_tokens=48), source)
    response = list(out.token_ids)
    assert len(response) == 48
    drawn = dict((position, (label, key)) for position, label, key in calls)  # one per position
    assert sorted(drawn) == list(range(48))
    committed = PROMPT + response
    keyed_positions = set()
    for t, (label, key) in drawn.items():
        assert label == label_at(committed, len(PROMPT) + t, width)
        if t < width:
            assert key == nonce_key(SECRET, 31, t)
        elif key == label_key(SECRET, label):
            keyed_positions.add(t)
        else:
            assert key == nonce_key(SECRET, 31, t)
    plan = detection_plan(response, width)
    assert keyed_positions == {p.position for p in plan if p.skip is None}
    assert {p.position for p in plan if p.skip is not None and p.skip.value == "no_context"} == set(
        range(width)
    )
    if width == 1:
        assert len(keyed_positions) < 48 - width  # repeats occurred: the test is not vacuous


def test_nonces_give_fresh_samples_and_mpfr_still_equals_basic_uwm(target):
    """Ten nonces, same key and prompt: ten different outputs (the first token already comes
    from the nonce stream); each mpfr output equals basic-uwm's for its nonce (Prop. 4.4)."""
    outputs = set()
    for nonce in range(10):
        source = KeyedSource(SECRET, 4, True, nonce)
        ref = generate(target, PROMPT, SamplerConfig("basic-uwm", max_new_tokens=12), source)
        spec = generate(
            target, PROMPT, SamplerConfig("mpfr", 4, 3, 12), source, self_drafter(target, 1)
        )
        assert spec.token_ids == ref.token_ids
        outputs.add(ref.token_ids)
    assert len(outputs) >= 9  # 64-token vocabulary: two of ten may collide by chance


def test_masking_off_ignores_the_nonce(target):
    """With masking off every position is keyed by its label: the nonce changes nothing."""
    cfg = SamplerConfig("basic-uwm", max_new_tokens=16)
    a = generate(target, PROMPT, cfg, KeyedSource(SECRET, 4, False, 1))
    b = generate(target, PROMPT, cfg, KeyedSource(SECRET, 4, False, 2))
    assert a.token_ids == b.token_ids
