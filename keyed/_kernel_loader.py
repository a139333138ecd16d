"""Loads the compiled keyed kernels (``keyed/_kernels.py``, numba) and checks them before use.

``kernels()`` imports the kernel module once per process, runs each kernel (which compiles it,
or loads it from numba's on-disk cache) and compares it with the NumPy path
(``keyed.philox.uniforms_numpy``) and a small known plan. It returns the module, or None:
then every CPU path (``keyed.prf``'s pivots and CPU clocks, ``keyed.context``'s plan) runs
NumPy, the same bits. None silently when numba is not installed; with a warning (once per
process) when it is but cannot serve — an import error (e.g. a NumPy newer than it supports),
no writable cache location, a compile failure, or kernels that disagree with NumPy.

Callers look ``kernels`` up on this module at each use (through ``kernels_for``), so tests
switch the kernels off with ``monkeypatch.setattr(_kernel_loader, "kernels", lambda: None)``.
``kernels_for`` leaves a small call to NumPy in a process that has not loaded them yet: a
one-shot ``poissonmark detect`` of a short text would spend more loading them than it saves.

Shapes: the checks run the kernels on small NumPy arrays: counters and keys (64,) int64 ->
uniforms (64,) float64; clocks (N, K, B) float64 for (N, K) int64 tokens; token ids (T,) int64
-> skip codes (T,) int8 and scored positions (T,) int64.
"""

from __future__ import annotations

import functools
import importlib
import logging
from collections.abc import Callable
from types import ModuleType

import numpy as np

from keyed.philox import uniforms_numpy

_CHECKS: list[Callable[[ModuleType], bool]] = []
"""Further checks a module must pass before use, added by the modules that hold their
reference (``add_check``)."""


def add_check(check: Callable[[ModuleType], bool]) -> None:
    """Require ``check(module)`` to be True before the kernels are used: ``keyed.prf`` adds the
    many-secrets BLAKE2b kernel's check against hashlib, whose reference it holds (this module
    imports nothing of ``keyed`` but the NumPy Philox, so the PRF can import it)."""
    _CHECKS.append(check)
    kernels.cache_clear()  # a module loaded before this check must pass it too


@functools.cache
def kernels() -> ModuleType | None:
    """``keyed._kernels``, compiled and checked on this machine, or None (module docstring)."""
    try:
        module = importlib.import_module("keyed._kernels")
        _check(module)
    except ModuleNotFoundError as exc:
        if exc.name == "numba":
            return None
        problem: Exception = exc
    except Exception as exc:  # detection must work whatever numba does here
        problem = exc
    else:
        return module
    logging.getLogger(__name__).warning(
        "keyed kernels unavailable (%s: %s); using the NumPy paths", type(problem).__name__,
        problem,
    )  # fmt: skip
    return None


SMALL_WORK = 1 << 16
"""Elements (pivots, uniforms, plan positions) below which a process whose kernels are not
loaded yet runs NumPy: loading and checking them costs ~0.5-1 s of CPU once, NumPy's Philox
about a microsecond an element."""


def kernels_for(work: int) -> ModuleType | None:
    """``kernels()`` for a call over ``work`` elements, or None (NumPy, the same bits) when the
    call is small and they are not loaded yet (``warm_up`` or an earlier large call loads
    them; the service and corpus workers warm up at start)."""
    info = getattr(kernels, "cache_info", None)  # absent when a test replaced ``kernels``
    if work < SMALL_WORK and info is not None and info().currsize == 0:
        return None
    return kernels()


def warm_up() -> bool:
    """Compile (or load from numba's on-disk cache) and check the keyed CPU kernels now, so the
    first detection or CPU generation does not pay for it (0.4-0.6 s once per process; the
    service calls this at start-up, corpus workers in their initializer).

    Returns:
        True when the compiled kernels are in use, False when the NumPy paths run (numba absent
        or unable to serve: ``kernels``; the same bits either way).
    """
    return kernels() is not None


def _check(module: ModuleType) -> None:
    """Run each kernel once and compare it with the NumPy path on 64 random words, with a small
    plan worked out by hand and with hashlib for many secrets. Raises ``RuntimeError`` on a
    mismatch."""
    rng = np.random.default_rng(0)
    c0, c1, k0, k1 = rng.integers(0, 2**32, size=(4, 64), dtype=np.int64)
    got = np.empty(64, dtype=np.float64)
    module.uniforms_into(c0, c1, k0, k1, got)
    keys, tokens = c0[:6].reshape(3, 2), c1[:12].reshape(3, 4)
    clocks = np.empty((3, 4, 2), dtype=np.float64)
    module.clock_uniforms_into(keys, tokens, clocks)
    grid = [np.broadcast_to(w, (3, 4, 2)).reshape(-1) for w in
            (tokens[:, :, None], np.arange(1, 3)[None, None, :], keys[:, None, None, 0],
             keys[:, None, None, 1])]  # fmt: skip
    ids = np.array([1, 2, 1, 2, 1, 3, 3], dtype=np.int64)  # m = 2: scored 2, 3, 6; repeats 4, 5
    skip, chosen = np.empty(7, dtype=np.int8), np.empty(7, dtype=np.int64)
    count = module.plan_into(ids, 2, 2, np.array([9], np.int64), skip, chosen, module.MULTIPLIER)
    if not (
        np.array_equal(got, uniforms_numpy(c0, c1, k0, k1))
        and np.array_equal(clocks.reshape(-1), uniforms_numpy(*grid))
        and skip.tolist() == [1, 1, 0, 0, 2, 2, 0]
        and chosen[:count].tolist() == [2, 3, 6]
        and all(check(module) for check in _CHECKS)
    ):
        raise RuntimeError("compiled keyed kernels disagree with the NumPy paths")
