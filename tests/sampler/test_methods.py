"""The table of methods (``sampler.methods.METHODS``): the config, the HTTP enum and the result's
watermark flag all follow its rows."""

from __future__ import annotations

import pytest

from keyed import KeyedSource, Secret
from sampler.decoder import SamplerConfig, generate
from sampler.drafters import NgramDrafter
from sampler.methods import HTTP_METHODS, METHODS, parse_method
from sampler.processing import Processing
from tests.sampler.conftest import VOCAB


@pytest.mark.parametrize("method", list(METHODS))
def test_config_properties_come_from_the_row(method):
    spec = METHODS[method]
    config = SamplerConfig(method, drafts=3, lookahead=2)
    assert config.speculative is spec.speculative
    assert config.effective_drafts == (1 if spec.single_draft else 3)
    assert config.effective_lookahead == (2 if spec.speculative else 0)


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("temperature", [pytest.param(1.0, id="T1"), pytest.param(0.0, id="T0")])
def test_watermark_applied_is_the_row_at_positive_temperature(target, method, temperature):
    source = KeyedSource(Secret(bytes(range(32))), 4, True, 9)
    config = SamplerConfig(method, 2, 2, 3, Processing(temperature, 8, 1.0))
    out = generate(target, [1, 2, 3], config, source, NgramDrafter(VOCAB))
    assert out.method == method
    assert out.watermark_applied is (METHODS[method].watermarked and temperature > 0)


def test_http_serves_no_baseline():
    """The unwatermarked baselines are for evaluation only; the HTTP enum is the table's order."""
    assert "vsps" not in HTTP_METHODS and "gls" not in HTTP_METHODS
    assert list(HTTP_METHODS) == [m for m in METHODS if METHODS[m].http]


def test_only_ephemeral_rows_are_unwatermarked_keyed_races():
    for method, spec in METHODS.items():
        assert not (spec.ephemeral_key and spec.watermarked), method


def test_unknown_method_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="one of ar, basic-uwm"):
        parse_method("mpfr2")
    with pytest.raises(ValueError, match="got 'MPFR'"):
        SamplerConfig("MPFR")  # type: ignore[arg-type]
    assert parse_method("gls") == "gls"
