"""``kernels_for``: a small call in a process that has not loaded the compiled kernels runs
NumPy (same bits) and does not load numba; once loaded, every call uses them (item 6:
a one-shot ``poissonmark detect`` of a short text)."""

from __future__ import annotations

from tests.fresh import fresh_python


def test_small_calls_do_not_load_numba_until_warmed_up() -> None:
    code = """
import sys
import numpy as np
from keyed import Secret, detection_plan_arrays, label_key_words, pivot_array
from keyed import _kernel_loader
labels = np.arange(40, dtype=np.int64).reshape(10, 4)
before = pivot_array(label_key_words(Secret(bytes(32)), labels), np.arange(10))
plan = detection_plan_arrays(np.arange(30) % 7, 4)
print('numba' in sys.modules, _kernel_loader.kernels_for(10) is None)
_kernel_loader.warm_up()
after = pivot_array(label_key_words(Secret(bytes(32)), labels), np.arange(10))
print(_kernel_loader.kernels_for(10) is not None, np.array_equal(before, after))
"""
    assert fresh_python(code).splitlines() == ["False True", "True True"]


def test_clock_uniforms_on_arrays_are_the_same_bits_with_and_without_the_kernel(monkeypatch):
    """``keyed.tensor.clock_uniforms_cpu``: the compiled kernel and the NumPy Philox over the
    broadcast grid give the same (N, K, B) uniforms, and ``clock_uniforms`` returns them."""
    import numpy as np
    import torch

    from keyed import _kernel_loader
    from keyed.tensor import clock_uniforms, clock_uniforms_cpu

    rng = np.random.default_rng(3)
    keys = rng.integers(0, 2**32, size=(5, 2), dtype=np.int64)
    tokens = rng.integers(0, 49152, size=(5, 7), dtype=np.int64)
    assert _kernel_loader.kernels() is not None, "numba is a dependency"
    compiled = clock_uniforms_cpu(keys, tokens, 3)
    monkeypatch.setattr(_kernel_loader, "kernels", lambda: None)
    plain = clock_uniforms_cpu(keys, tokens, 3)
    assert compiled.shape == plain.shape == (5, 7, 3)
    assert np.array_equal(compiled, plain)
    through = clock_uniforms(torch.from_numpy(keys), torch.from_numpy(tokens), 3)
    assert np.array_equal(through.numpy(), plain)
