"""The target's forward profile: t(n), its forward seconds over n new tokens after a cached
context, measured once per machine and target and kept as JSON in the data dir, keyed by the
machine fingerprint (CPU, threads, torch version, backend and model).

The tree chooser (``sampler.autotree``) sizes draft trees from it; it lives with the targets
because it measures a target and is kept beside it (``Target.forward_profile``,
``Target.profile_dir``), so loading a model never reaches the chooser.

Shapes: n new tokens of one chain forward.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import os
import platform
import statistics
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import torch
from transformers import PreTrainedModel

from sampler.targets.base import Target
from sampler.targets.cpu_features import cpu_flags, cpu_model
from sampler.targets.masks import chain_visible
from sampler.targets.transformers import as_target

log = logging.getLogger("poissonmark.autotree")

PROFILE_NODES: Final = (1, 2, 3, 5, 9, 17, 33)
PROFILE_CONTEXT: Final = 128
PROFILE_REPEATS: Final = 3
PROFILE_VERSION: Final = "2"  # 2: each timed forward after a one-token one (measure_profile)


@dataclass(frozen=True)
class ForwardProfile:
    """Target forward seconds per number of new tokens.

    Attributes:
        nodes: increasing node counts n >= 1 (``PROFILE_NODES``).
        seconds: the median forward seconds at each, after ``PROFILE_CONTEXT`` cached tokens.
    """

    nodes: tuple[int, ...]
    seconds: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.nodes) < 2 or len(self.nodes) != len(self.seconds):
            raise ValueError(f"expected >= 2 nodes with a time each, got {self}")
        if list(self.nodes) != sorted(set(self.nodes)) or self.nodes[0] != 1:
            raise ValueError(f"expected increasing node counts from 1, got {self.nodes}")
        if not all(math.isfinite(s) and s > 0 for s in self.seconds):
            raise ValueError(f"expected positive finite seconds, got {self.seconds}")

    def cost(self, n: float) -> float:
        """t(n) in seconds: piecewise linear between the measured counts, the last segment's
        slope beyond them (n >= 1)."""
        xs, ys = self.nodes, self.seconds
        for i in range(1, len(xs)):
            if n <= xs[i] or i == len(xs) - 1:
                slope = (ys[i] - ys[i - 1]) / (xs[i] - xs[i - 1])
                return max(ys[i - 1] + slope * (n - xs[i - 1]), min(ys))
        raise AssertionError("unreachable")


def measure_profile(
    target: Target | PreTrainedModel, repeats: int = PROFILE_REPEATS
) -> ForwardProfile:
    """Time the target's forward over chains of ``PROFILE_NODES`` new tokens after
    ``PROFILE_CONTEXT`` cached ones (its own backend: ``targets.transformers.open_cache``), each
    right after a one-token forward (what a tree step follows); medians of ``repeats`` after one
    warm-up. Token ids are fixed (nothing keyed); ~2 s on the real model
    on 2 CPU cores."""
    served = as_target(target)
    vocab = served.vocab_size
    cuda = served.device.type == "cuda"
    lm = served.new_cache()
    lm.extend([(17 * i + 1) % vocab for i in range(PROFILE_CONTEXT)])
    base = lm.cached
    one = chain_visible(base, 1)
    seconds = []
    for n in PROFILE_NODES:
        visible = chain_visible(base, n)
        times = []
        for attempt in range(repeats + 1):
            # as in decoding, a tree comes after one-token steps: a backend that reuses its
            # last compute graph for the same shape (llama.cpp) pays a new one here. On
            # llama.cpp (Intel Xeon, 2 cores) a 2-node forward read 1.29 one-token ones timed
            # back to back and 1.43 this way (one-off); inside requests 1.31
            # (bench/results/gguf_step_costs.json) to 1.5 (one-off, an hour later): the machine
            # moves it, and TreeChooser.forward_scale follows what each request measures
            lm.forward([7], [0], one, base)
            lm.keep(base, [])
            if cuda:
                torch.cuda.synchronize()
            began = time.perf_counter()
            lm.forward([(5 * i + 3) % vocab for i in range(n)], list(range(n)), visible, base)
            if cuda:
                torch.cuda.synchronize()
            if attempt:  # the first is a warm-up
                times.append(time.perf_counter() - began)
            lm.keep(base, [])
        seconds.append(statistics.median(times))
    return ForwardProfile(PROFILE_NODES, tuple(seconds))


def set_profile_dir(target: Target | PreTrainedModel, directory: Path) -> None:
    """Where ``profile_for`` keeps ``target``'s profile on disk (``models.load_model`` sets
    ``<data dir>/profiles``)."""
    as_target(target).profile_dir = directory


def library_build(version: str, libraries: Path) -> str:
    """A native build's identity for ``machine_fingerprint``: its package ``version`` and a
    digest of the shared libraries in ``libraries`` (names and bytes), since one version label
    may carry other kernels (a rebuilt patch set keeps it); ``version`` alone where the
    directory holds none or cannot be read. The digest (~40 ms for llama.cpp's ~20 MB) is kept
    per process while the files' names, sizes and modification times stay the same."""
    try:
        files = tuple(
            (p, p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(libraries.iterdir())
            if p.is_file() and (p.name.endswith((".so", ".dylib", ".dll")) or ".so." in p.name)
        )
        return _library_build(version, files)
    except OSError:
        return version


@functools.lru_cache(maxsize=8)
def _library_build(version: str, files: tuple[tuple[Path, int, int], ...]) -> str:
    if not files:
        return version
    digest = hashlib.sha256()
    for path, _, _ in files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return f"{version}:{digest.hexdigest()[:16]}"


def machine_fingerprint(target: Target | PreTrainedModel) -> dict[str, str]:
    """What a forward profile depends on: CPU model and flags, threads, torch, the backend
    (runner, llama.cpp or transformers, dtype), its build where it has one (llama.cpp's
    kernels: ``GgufTarget.build``) and the model."""
    served = as_target(target)
    model = served.model
    params = sum(p.numel() for p in model.parameters())
    return {
        "profile": PROFILE_VERSION,
        "cpu": cpu_model(),
        "cpu_flags": hashlib.sha256(" ".join(sorted(cpu_flags())).encode()).hexdigest()[:16],
        "machine": platform.machine(),
        "threads": str(torch.get_num_threads()),
        "torch": torch.__version__,
        "backend": served.backend(),
        "build": str(getattr(served, "build", "")),
        "device": str(served.device),
        "model": f"{getattr(model.config, 'model_type', '?')}:{params}",
    }


def profile_for(target: Target | PreTrainedModel) -> ForwardProfile:
    """``target``'s forward profile: from memory (``Target.forward_profile``), else from the
    profile dir's JSON for this machine fingerprint, else measured (and written there)."""
    served = as_target(target)
    cached = served.forward_profile
    if isinstance(cached, ForwardProfile):
        return cached
    fingerprint = machine_fingerprint(served)
    path = cache_path(served, "forward", fingerprint)
    profile = _read_profile(path) if path is not None else None
    if profile is None:
        profile = measure_profile(served)
        log.info("forward profile measured: %s s per node count", profile)
        if path is not None:
            _write_profile(path, profile, fingerprint)
    served.forward_profile = profile
    return profile


def _read_profile(path: Path) -> ForwardProfile | None:
    try:
        data = json.loads(path.read_text())
        return ForwardProfile(tuple(data["nodes"]), tuple(data["seconds"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_profile(path: Path, profile: ForwardProfile, fingerprint: dict[str, str]) -> None:
    body = {"nodes": profile.nodes, "seconds": profile.seconds, "fingerprint": fingerprint}
    write_json(path, body, "forward profile")


def cache_path(target: Target, kind: str, key: Mapping[str, object]) -> Path | None:
    """``<profile dir>/<kind>-<digest of key>.json``: a file of what was measured on this
    machine (``key`` holds ``machine_fingerprint`` and what else the measurement depends on);
    None without a profile dir (``set_profile_dir``)."""
    if target.profile_dir is None:
        return None
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    return Path(target.profile_dir) / f"{kind}-{name}.json"


def write_json(path: Path, body: object, what: str) -> bool:
    """Write ``body`` as JSON to ``path`` atomically (a temporary file renamed: concurrent
    processes leave one whole file); False, logged as ``what`` not saved, where the directory
    is not writable (what was measured stays in memory)."""
    temporary = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary.write_text(json.dumps(body, indent=1) + "\n")
        temporary.replace(path)
        return True
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        log.warning("%s not saved: %s", what, exc)
        return False
