"""The compiled keyed kernels (keyed/_kernels.py, numba) give the NumPy paths' bits.

Every CPU caller (detector pivots and plan, the sampler's CPU clocks) runs the kernels when
numba is installed (it is a dependency) and the NumPy paths otherwise; both are checked here
on random words including the extremes, and the whole detection is compared end to end."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import keyed
from keyed import _kernel_loader, prf, tensor
from keyed.philox import BELOW_ONE, TWO_POW_53, philox4x32_10_numpy


def _words(size: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    words = rng.integers(0, 2**32, size=(4, size), dtype=np.int64)
    words[:, :4] = [[0, 2**32 - 1, 0, 2**32 - 1]] * 4
    return words


def test_kernels_are_in_use() -> None:
    assert _kernel_loader.kernels() is not None
    assert keyed.warm_up() is True


@pytest.mark.parametrize("size", [4, 483, 20_000])
def test_pivot_kernel_equals_numpy_philox(size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    c0, _, k0, k1 = _words(size, seed=size)
    keys = np.stack([k0, k1], axis=1)
    compiled = prf.pivot_array(keys, c0)
    assert compiled.dtype == np.float64 and bool((compiled < 1.0).all() and (compiled > 0).all())
    # Outside the contract (key words >= 2^32) both paths still agree, as the tensor path does;
    # Fortran order and other integer dtypes give the same values through one compiled version.
    wide = keys + 2**32
    compiled_wide = prf.pivot_array(wide, c0)
    assert np.array_equal(prf.pivot_array(np.asfortranarray(keys), c0.astype(np.uint32)), compiled)
    kernels = _kernel_loader.kernels()
    assert kernels is not None and len(kernels.uniforms_into.signatures) == 1
    monkeypatch.setattr(_kernel_loader, "kernels", lambda: None)
    assert np.array_equal(prf.pivot_array(keys, c0), compiled)
    assert np.array_equal(prf.pivot_array(wide, c0), compiled_wide)


def test_uniform_kernel_equals_numpy_philox() -> None:
    c0, c1, k0, k1 = _words(50_000, seed=7)
    out = np.empty(c0.shape[0])
    kernels = _kernel_loader.kernels()
    assert kernels is not None
    kernels.uniforms_into(c0, c1, k0, k1, out)
    u64 = np.uint64  # the mapping spelled out here, not through prf's helper
    x0, x1 = philox4x32_10_numpy(*(w.astype(u64) for w in (c0, c1, k0, k1)))
    top = ((x1 << u64(21)) | (x0 >> u64(11))).astype(np.float64)
    assert np.array_equal(out, np.minimum((top + 0.5) / TWO_POW_53, BELOW_ONE))


def test_uniforms_from_keys_same_with_and_without_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sampler's CPU clocks, on broadcast shapes (N, K, B), through either path."""
    rng = np.random.default_rng(3)
    k = torch.from_numpy(rng.integers(0, 2**32, size=(5, 2)))
    tokens = torch.from_numpy(rng.integers(0, 49_152, size=(5, 300)))
    compiled = tensor.clock_uniforms(k, tokens, 4)
    monkeypatch.setattr(_kernel_loader, "kernels", lambda: None)
    assert torch.equal(compiled, tensor.clock_uniforms(k, tokens, 4))


def test_detection_same_with_and_without_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole detection (plan, keys, pivots, scores) is bit-identical on either path."""
    from detector import DetectOptions
    from detector.detect import detect_tokenized
    from detector.tokens import TokenizedText

    rng = np.random.default_rng(11)
    ids = np.concatenate([rng.integers(0, 49_152, 300), np.tile([7, 8, 9], 40)])
    text = TokenizedText.from_spans(ids, "x" * ids.size, [(i, i + 1) for i in range(ids.size)])
    source = keyed.KeyedSource(keyed.Secret(bytes(range(32))))
    options = DetectOptions(scores=("u", "li", "lattimore"), spans=True)
    compiled = detect_tokenized(text, frozenset({0, 1, 2}), source, options)
    monkeypatch.setattr(_kernel_loader, "kernels", lambda: None)
    assert keyed.warm_up() is False
    plain = detect_tokenized(text, frozenset({0, 1, 2}), source, options)
    assert compiled.to_json() == plain.to_json()
    # 296 random positions after the first 4, 4 labels spanning the seam, the cycle's 3 labels
    assert compiled.num_scored == 296 + 4 + 3


def test_plan_kernel_is_exact_when_every_label_lands_in_one_slot() -> None:
    """With a known multiplier (the Fibonacci one), labels crafted so that their hashes all fall
    in slot 0 of the table (the multiply inverted): the probe chains are as long as they get,
    and the plan still equals the NumPy path's. (The per-process random multiplier keeps such
    texts from being built.)"""
    from keyed.context import _LABEL_OFFSETS, _plan_numpy

    kernels = _kernel_loader.kernels()
    assert kernels is not None
    fibonacci = 0x9E3779B97F4A7C15
    inverse = pow(fibonacci, -1, 2**64)
    rng = np.random.default_rng(5)
    labels: list[int] = []
    while len(labels) < 4 * 500:  # 500 labels of 4 ids < 49152, hash top 16 bits all zero
        packed = (int(rng.integers(0, 2**48)) * inverse) % 2**64
        words = [(packed >> shift) & 0xFFFF for shift in (48, 32, 16, 0)]
        if max(words) < 49_152:
            labels.extend(words)
    ids = np.array(labels * 2, dtype=np.int64)  # every label twice: half are repeats
    skip, chosen = np.empty(ids.size, np.int8), np.empty(ids.size, np.int64)
    bits = int(ids.max()).bit_length()
    assert bits == 16  # the packing the crafting assumed: 4 ids of 16 bits
    no_special, multiplier = np.zeros(0, np.int64), np.uint64(fibonacci)
    count = kernels.plan_into(ids.copy(), 4, bits, no_special, skip, chosen, multiplier)
    reference = _plan_numpy(ids, 4, frozenset())
    assert np.array_equal(skip, reference.skip)
    assert np.array_equal(chosen[:count], reference.scored)
    assert np.array_equal(ids[chosen[:count, None] + _LABEL_OFFSETS[4]], reference.labels)


def test_the_plan_hashes_with_the_process_multiplier(monkeypatch: pytest.MonkeyPatch) -> None:
    """``detection_plan_arrays`` hands the kernel the per-process random odd multiplier, and
    special ids that cannot be token ids (negative, past int64) are simply never matched."""
    from keyed.context import detection_plan, detection_plan_arrays

    kernels = _kernel_loader.kernels()
    assert kernels is not None and int(kernels.MULTIPLIER) % 2 == 1
    seen: list[object] = []
    original = kernels.plan_into

    def recording(*args: object) -> int:
        seen.append(args[-1])
        return int(original(*args))

    monkeypatch.setattr(kernels, "plan_into", recording)
    ids = np.tile([5, 6, 7, 5], 30)
    special = frozenset({-1, 2**64, 7})
    plan = detection_plan_arrays(ids, 2, special)
    assert seen == [kernels.MULTIPLIER]
    reference = detection_plan(ids.tolist(), 2, masking=True, special_ids=special)
    assert plan.scored.tolist() == [p.position for p in reference if p.skip is None]


@pytest.mark.parametrize(
    ("error", "warns"),
    [
        (ModuleNotFoundError("No module named 'numba'", name="numba"), False),
        (ImportError("Numba needs NumPy 2.3 or less"), True),  # numba there, too old for NumPy
        (RuntimeError("cannot cache function '_uniform': no locator available"), True),
    ],
    ids=["numba_absent", "numba_too_old", "no_cache_location"],
)
def test_kernels_fall_back_to_numpy(
    error: Exception, warns: bool, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """numba absent: the NumPy paths, silently. numba present but unable to serve: a warning,
    then the NumPy paths — never a failed detection."""
    import importlib

    def broken(name: str) -> object:
        raise error

    monkeypatch.setattr(importlib, "import_module", broken)
    with caplog.at_level("WARNING", logger="keyed._kernel_loader"):
        assert _kernel_loader.kernels.__wrapped__() is None  # type: ignore[attr-defined]
    assert ("using the NumPy paths" in caplog.text) is warns


@pytest.mark.parametrize("kernel", ["uniforms_into", "clock_uniforms_into"])
def test_kernels_that_disagree_with_numpy_are_not_used(
    kernel: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The loader compares each kernel with the NumPy path on this machine before using it."""
    import importlib
    import types

    kernels = _kernel_loader.kernels()
    assert kernels is not None
    wrong = types.SimpleNamespace(
        plan_into=kernels.plan_into,
        MULTIPLIER=kernels.MULTIPLIER,
        uniforms_into=kernels.uniforms_into,
        clock_uniforms_into=kernels.clock_uniforms_into,
    )
    right = getattr(kernels, kernel)

    def off_by_one_bit(*args):  # type: ignore[no-untyped-def]
        right(*args)
        out = args[-1].reshape(-1)
        out[0] = np.nextafter(out[0], 0.0)

    setattr(wrong, kernel, off_by_one_bit)
    monkeypatch.setattr(importlib, "import_module", lambda name: wrong)
    with caplog.at_level("WARNING", logger="keyed._kernel_loader"):
        assert _kernel_loader.kernels.__wrapped__() is None  # type: ignore[attr-defined]
    assert "disagree with the NumPy paths" in caplog.text


def test_a_many_secrets_kernel_that_disagrees_with_hashlib_is_not_used(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """keyed.prf adds the BLAKE2b kernel's check to the loader (the loader imports no prf)."""
    import importlib
    import types

    kernels = _kernel_loader.kernels()
    assert kernels is not None
    wrong = types.SimpleNamespace(
        plan_into=kernels.plan_into,
        MULTIPLIER=kernels.MULTIPLIER,
        uniforms_into=kernels.uniforms_into,
        clock_uniforms_into=kernels.clock_uniforms_into,
    )

    def pivots_one_bit_off(*args):  # type: ignore[no-untyped-def]
        kernels.pivots_many_into(*args)
        args[-1][0, 0] = np.nextafter(args[-1][0, 0], 0.0)

    wrong.pivots_many_into = pivots_one_bit_off
    monkeypatch.setattr(importlib, "import_module", lambda name: wrong)
    with caplog.at_level("WARNING", logger="keyed._kernel_loader"):
        assert _kernel_loader.kernels.__wrapped__() is None  # type: ignore[attr-defined]
    assert "disagree with the NumPy paths" in caplog.text


@pytest.mark.parametrize("width", [1, 4, 28, 29, 64], ids=lambda m: f"m{m}")
def test_pivot_matrix_equals_the_one_key_path(width: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # Multi-key detection's pivots: row k is bit for bit the one-key path (hashlib BLAKE2b then
    # Philox) for secret k; m = 28 / 29 are the last one-block and first two-block messages,
    # m = 64 takes three. Extreme label ids and tokens included.
    rng = np.random.default_rng(width)
    labels = rng.integers(0, 2**32, size=(40, width), dtype=np.int64)
    labels[0], labels[1] = 0, 2**32 - 1
    tokens = rng.integers(0, 2**32, size=40, dtype=np.int64)
    tokens[:2] = [0, 2**32 - 1]
    secrets = [prf.Secret(bytes([i]) * 32) for i in range(6)]
    expected = np.stack([prf.pivot_array(prf.label_key_words(s, labels), tokens) for s in secrets])
    assert np.array_equal(prf.pivot_matrix(secrets, labels, tokens), expected)
    assert prf.pivot_matrix([], labels, tokens).shape == (0, 40)
    assert prf.pivot_matrix(secrets, labels[:0], tokens[:0]).shape == (6, 0)
    monkeypatch.setattr(_kernel_loader, "kernels", lambda: None)
    assert np.array_equal(prf.pivot_matrix(secrets, labels, tokens), expected)


def test_pivot_matrix_rejects_bad_input() -> None:
    secret = prf.Secret(bytes(32))
    with pytest.raises(ValueError, match=r"labels \(N, m\) and tokens \(N,\)"):
        prf.pivot_matrix([secret], np.zeros((3, 4), np.int64), np.zeros(2, np.int64))
    with pytest.raises(ValueError, match=r"label ids in \[0, 2\^32\)"):
        prf.pivot_matrix([secret], np.full((1, 4), 2**32), np.zeros(1, np.int64))
    with pytest.raises(ValueError, match="Secret"):
        prf.pivot_matrix([bytes(32)], np.zeros((1, 4), np.int64), np.zeros(1, np.int64))  # type: ignore[list-item]


@pytest.mark.parametrize("arrivals", [1, 3])
def test_sampler_clocks_are_the_same_bits_compiled_and_not(
    arrivals: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``keyed.tensor.clock_uniforms`` on the CPU: the one-call kernel (``clock_uniforms_into``)
    gives the bits of the NumPy path, for small and large rows and full 32-bit key words."""
    clock_uniforms = tensor.clock_uniforms
    assert _kernel_loader.kernels() is not None  # loaded: clock_uniforms uses it
    generator = torch.Generator().manual_seed(arrivals)
    keys = torch.randint(0, 2**32, (5, 2), generator=generator)
    keys[0] = torch.tensor([0, 2**32 - 1])
    for width in (1, 50, 4099):
        tokens = torch.randint(0, 2**32, (5, width), generator=generator)
        compiled = clock_uniforms(keys, tokens, arrivals)
        with monkeypatch.context() as patch:
            patch.setattr(_kernel_loader, "kernels", lambda: None)
            reference = clock_uniforms(keys, tokens, arrivals)
        assert compiled.shape == (5, width, arrivals)
        assert torch.equal(compiled, reference)
