"""``generate(..., on_tokens=...)``: the per-step callback the service streams and cancels with."""

from __future__ import annotations

import pytest

from keyed import KeyedSource, Secret
from sampler.decoder import SamplerConfig, generate
from sampler.drafters import ModelDrafter, NgramDrafter
from tests.sampler.conftest import VOCAB


class Stop(Exception):
    pass


def source(i: int) -> KeyedSource:
    return KeyedSource(Secret(i.to_bytes(32, "little")), 4, True, i)


@pytest.mark.parametrize(
    ("method", "drafter"),
    [
        pytest.param("basic-uwm", None, id="basic_uwm"),
        pytest.param("mpfr", "ngram", id="mpfr_ngram"),
        pytest.param("mpfr", "self", id="mpfr_self_weights"),
    ],
)
def test_callback_chunks_concatenate_to_the_result(target, method, drafter):
    """Every step reports its tokens once, in order; the result does not change."""
    make = {
        None: lambda: None,
        "ngram": lambda: NgramDrafter(VOCAB),
        "self": lambda: ModelDrafter(target, VOCAB, "self"),
    }[drafter]
    config = SamplerConfig(method, 4, 3, 40)
    for i in range(4):
        prompt = [(5 * i + j) % VOCAB for j in range(3 + i)]
        plain = generate(target, prompt, config, source(i), make())
        chunks: list[list[int]] = []
        streamed = generate(target, prompt, config, source(i), make(), on_tokens=chunks.append)
        assert streamed.token_ids == plain.token_ids
        assert [t for chunk in chunks for t in chunk] == list(plain.token_ids)
        assert len(chunks) == plain.stats.target_forward_passes  # one call per step
        if drafter == "self":
            assert max(len(c) for c in chunks) > 1  # several tokens per step were reported


def test_callback_exception_stops_generation(target):
    calls = []

    def stop_after_two(tokens: list[int]) -> None:
        calls.append(tokens)
        if len(calls) == 2:
            raise Stop

    with pytest.raises(Stop):
        generate(
            target,
            [1, 2, 3],
            SamplerConfig("basic-uwm", max_new_tokens=50),
            source(9),
            on_tokens=stop_after_two,
        )
    assert len(calls) == 2
