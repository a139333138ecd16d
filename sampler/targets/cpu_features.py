"""What this CPU offers the target backends, read at run time (no torch import here).

Machines of this kind differ (Intel Xeon with AMX, AMD EPYC without): the choices that depend
on the hardware read ``/proc/cpuinfo`` here instead of assuming one.

- ``native_bfloat16()``: the CPU multiplies bfloat16 in hardware with AMX (``amx_bf16``), the
  only kind on which the bfloat16 runner (``sampler.targets.cpu_bf16``) was measured faster and
  row-invariant (``bench/results/speed_cpu_bf16.json``, ``service_load_batching_bf16.json``).
- ``prefer_passive_omp_wait()``: OpenMP's wait policy, read once when torch loads its OpenMP
  runtime. With the default (threads spin between parallel regions) one bfloat16 runner
  forward beside another busy multi-threaded process was seen at 1.2 s against 47 ms with
  ``OMP_WAIT_POLICY=PASSIVE``; quiet, PASSIVE measured 33.3 against 36.4 ms per one-token
  forward (``bench/results/omp_contention.json``). It is set only where the runner is the
  default (``native_bfloat16`` and no llama.cpp installed: with llama-cpp-python precision
  ``auto`` is ``gguf``; with an OpenMP build of llama.cpp its forwards shared torch's runtime
  and slowed ~4x under PASSIVE, 10 against 41 ms in a one-off EPYC probe; setup.sh builds
  it without OpenMP, where the policy's effect was not re-measured), only when the user has
  not set it, and only before torch is imported (afterwards it would have no effect).
  transformers' float32 path is slower under PASSIVE (44.9 against 34.8 ms quiet): whoever
  runs float32 on such a machine can set ``OMP_WAIT_POLICY=ACTIVE``.
- ``CoreShare``: llama.cpp's thread count per decode, the CPUs other runnable tasks leave
  free (``procs_running``).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import platform
import sys
from pathlib import Path
from typing import Any

__all__ = ["cpu_flags", "cpu_model", "native_bfloat16", "prefer_passive_omp_wait"]


@functools.cache
def _first_cpu(cpuinfo: Path) -> dict[str, str]:
    """The first CPU's ``name: value`` lines of ``/proc/cpuinfo`` (empty where it is missing:
    not Linux)."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            break
        name, _, value = line.partition(":")
        fields.setdefault(name.strip(), value.strip())
    return fields


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The first CPU's feature flags (empty where ``/proc/cpuinfo`` is missing: not Linux)."""
    return frozenset(_first_cpu(cpuinfo).get("flags", "").split())


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The first CPU's model name (``platform.processor()`` where ``/proc/cpuinfo`` is
    missing)."""
    return _first_cpu(cpuinfo).get("model name") or platform.processor() or "unknown"


def native_bfloat16() -> bool:
    """Whether the CPU has AMX bfloat16 tiles (``amx_bf16``)."""
    return "amx_bf16" in cpu_flags()


def prefer_passive_omp_wait() -> bool:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` (module docstring) if unset, the CPU has
    ``native_bfloat16``, llama-cpp-python is not installed and torch is not imported yet;
    returns whether it set it."""
    if "OMP_WAIT_POLICY" in os.environ or "torch" in sys.modules or not native_bfloat16():
        return False
    if importlib.util.find_spec("llama_cpp") is not None:  # precision auto is gguf
        return False
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return True


_OPEN: dict[Path, int] = {}


def procs_running(loadavg: Path = Path("/proc/loadavg")) -> int | None:
    """Runnable tasks on the machine at this instant (the reading thread included): the
    running count of ``/proc/loadavg``'s fourth field (``running/total``, the same count as
    ``/proc/stat``'s ``procs_running``), read through a descriptor kept open: it runs
    before every decode, and a pread of one short line is cheaper than opening and parsing
    ``/proc/stat``; None where it cannot be read."""
    try:
        fd = _OPEN.get(loadavg)
        if fd is None:
            opened = os.open(loadavg, os.O_RDONLY | os.O_CLOEXEC)
            fd = _OPEN.setdefault(loadavg, opened)
            if fd != opened:  # another thread's came first
                os.close(opened)
        return int(os.pread(fd, 256, 0).split()[3].split(b"/")[0])
    except (OSError, ValueError, IndexError):
        return None


class CoreShare:
    """llama.cpp's thread count per decode: the CPUs other runnable tasks leave free.

    ggml's threads meet at a spinning barrier after every operation (hundreds per forward),
    so a forward on n threads runs at the pace of the thread the kernel schedules last: with
    two busy processes beside a 2-thread forward on 2 cores, generation kept 9-18 % of its
    quiet speed, where one thread gets the fair share. Before each decode the other runnable
    tasks (``procs_running`` less the reading thread) are read and smoothed (weight
    ``weight`` per decode); the threads are the CPUs less the rounded average, at least one.

    Attributes:
        cpus: the most threads (the CPUs this process may run on, or a fixed count).
        others: the smoothed count of other runnable tasks.
    """

    def __init__(self, cpus: int, weight: float = 0.25, read: Any = procs_running) -> None:
        self.cpus = cpus
        self.weight = weight
        self.others = 0.0
        self._read = read

    def threads(self) -> int:
        """Threads for the next decode (reads the machine once)."""
        running = self._read()
        if running is None or self.cpus == 1:
            return self.cpus
        self.others += self.weight * (max(running - 1, 0) - self.others)
        return max(1, self.cpus - round(self.others))
