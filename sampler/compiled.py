"""The decoder's compiled CPU kernels (``sampler._kernels``, numba): imported once per process,
each one checked against its torch reference before it is used (``checked``).

Two policies, by what a kernel may change:
- ``sampler.topk``'s kernel returns exactly ``torch.topk``'s answer, so it is used only once
  warmed up (``sampler.models.load_model`` warms it beside the model load) and torch runs
  until then: the first generation of a process never waits for a compile, and the switch
  changes no result;
- the log-softmax of ``sampler.processing.process`` and the race of
  ``sampler.race.race_winner_of_uniforms``
  compute the same law as their torch paths but not always the same bits (another
  ``exp``/``log`` and summation order: a log-probability may move in its last bit, and a slot
  whose better slots' mass lies within a rounding of top-p may fall on the other side of the
  cut), so each is decided ONCE per process (``once``: single-flight under a lock; the load's
  warm-up thread asks first, ~0.5 s from numba's disk cache, and a generation that starts
  before waits for it): every row of every step of every request then goes through the same
  arithmetic, whatever B, L or the batch (MPFR Thm. 5.1's drafter invariance needs a
  context's race to be the same bits wherever it runs).

Why compiled: right after a llama.cpp forward (precision gguf), whose weights have evicted the
caches, the ~20 small torch ops of ``process`` and the race cost ~0.5 ms of a ~11 ms token;
compiled, ~0.2 ms (AMD EPYC, 2 cores; docs/experiments/gguf-step-costs.md).
"""

from __future__ import annotations

import functools
import importlib
import logging
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

_decided: dict[str, Any] = {}
_deciding = threading.Lock()


@functools.cache
def module() -> ModuleType | None:
    """``sampler._kernels`` imported (None silently without numba, with a warning when numba
    is installed but the import fails)."""
    try:
        return importlib.import_module("sampler._kernels")
    except ModuleNotFoundError as exc:
        if exc.name == "numba":
            return None
        problem: Exception = exc
    except Exception as exc:  # decoding must work whatever numba does here
        problem = exc
    log.warning("compiled kernels unavailable (%s: %s)", type(problem).__name__, problem)
    return None


def checked(what: str, get: Callable[[ModuleType], T], agrees: Callable[[T], bool]) -> T | None:
    """``get(module())`` when the module imports and ``agrees`` holds for it (it compiles the
    kernel, or loads it from numba's on-disk cache); None, with a warning naming ``what``,
    when the check fails or raises."""
    loaded = module()
    if loaded is None:
        return None
    try:
        kernel = get(loaded)
        if agrees(kernel):
            return kernel
        problem = f"the compiled {what} disagrees with torch"
    except Exception as exc:  # decoding must work whatever numba does here
        problem = f"{type(exc).__name__}: {exc}"
    log.warning("compiled %s unavailable (%s); using torch", what, problem)
    return None


def once(what: str, get: Callable[[ModuleType], T], agrees: Callable[[T], bool]) -> T | None:
    """``checked(what, get, agrees)`` decided once per process under a lock: every caller, on
    any thread, gets the same answer, so the arithmetic never changes after the first call."""
    with _deciding:
        if what not in _decided:
            _decided[what] = checked(what, get, agrees)
        kernel: T | None = _decided[what]
        return kernel
