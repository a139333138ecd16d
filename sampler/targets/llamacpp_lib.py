"""Loading llama.cpp for the GGUF target (``sampler.targets.llamacpp``): whether
``llama-cpp-python`` imports, whether it is ``scripts/setup.sh``'s patched build, its backend
initialised once per process with its log routed to ours, and the CPU threads it may use."""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from typing import Any

log = logging.getLogger("poissonmark.gguf")

_backend_lock = threading.Lock()
_backend_ready = False


class GgufUnavailable(RuntimeError):
    """``llama-cpp-python`` is not installed (``pip install 'poissonmark[gguf]'``, built by
    ``scripts/setup.sh``) or the model has no GGUF file."""


def available() -> bool:
    """Whether ``llama_cpp`` imports (without loading a model)."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


PATCHED_BUILD = "+poissonmark.amx2"
"""The local version label ``scripts/setup.sh`` gives its llama-cpp-python build, which carries
``scripts/llama-cpp-amx-tilecfg.patch``: without it, with GCC 12, ggml's AMX kernels load a
garbage tile configuration and the process dies (SIGSEGV/SIGILL) on the first batch of >= 2
tokens, which no probe can catch; the earlier ``amx1`` patch loaded it once per
thread, and died after another AMX user (torch's oneDNN bfloat16 matmul) released the tiles."""


ROW_KERNELS_BUILD = "+poissonmark.amx2.rows"
"""The version label of ``scripts/setup.sh``'s build once it also carries
``scripts/llama-cpp-row-kernels.patch``: Q4_1 x Q8_1 and Q8_0 x Q8_0 matrix kernels (AVX2 + FMA
CPUs) that llama.cpp takes for every row count, one row included, so a forward of q rows costs
far less than q one-row forwards and each row's logits are the same bits whatever the batch
(tinyBLAS's F32, F16 and BF16 kernels are taken for one row too: files of those types keep a
row's bits as well); and flash attention over the Q8_0 KV cache that reads a row's visible
cells only, so that sequences sharing one context do not pay for each other's cells."""


def repacking_safe() -> bool:
    """Whether llama.cpp's weight repacking into its extra CPU buffer types (AMX tiles where the
    CPU has them) can be switched on: the installed llama-cpp-python is ``scripts/setup.sh``'s
    patched build (``PATCHED_BUILD`` in its version). False when llama_cpp does not import."""
    try:
        import llama_cpp
    except ImportError:
        return False
    return PATCHED_BUILD in str(getattr(llama_cpp, "__version__", ""))


def _lib() -> Any:
    global _backend_ready
    try:
        import llama_cpp
    except ImportError as exc:
        raise GgufUnavailable(
            "precision gguf needs llama-cpp-python (scripts/setup.sh builds it for this CPU)"
        ) from exc
    with _backend_lock:
        if not _backend_ready:
            llama_cpp.llama_backend_init()
            llama_cpp.llama_log_set(_QUIET, ctypes.c_void_p())
            _backend_ready = True
    return llama_cpp


def _quiet(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    if level == 3:  # GGML_LOG_LEVEL_ERROR (0 none, 1 info, 2 warn, 4 debug, 5 cont)
        log.error("llama.cpp: %s", text.decode(errors="replace").rstrip())


def _make_quiet() -> Any:
    try:
        import llama_cpp
    except ImportError:
        return None
    return llama_cpp.llama_log_callback(_quiet)


_QUIET = _make_quiet()  # kept alive for the process: llama.cpp holds the pointer


def cpu_threads() -> int:
    """Threads for llama.cpp: the CPUs this process may run on."""
    return max(1, len(os.sched_getaffinity(0)))
