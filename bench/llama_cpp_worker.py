"""llama.cpp's own sampling, as bench/speed_cpu.py's llama.cpp peer rows time it.

``open_llama`` and ``sample`` are the peer's model and its timed loop. The same file runs as a
worker process under another environment's python (the ``llama.cpp-pypi`` row: a plain PyPI
build of llama-cpp-python, bench/pypi_llama_cpp.sh), so it imports nothing of this project and
nothing outside the standard library at module level.

Worker protocol, one JSON object a line on stdin and stdout:
- first line ``{"model": path, "threads": n, "repack": bool, "stop": [ids]}``; the answer is
  ``{"version": llama_cpp.__version__, "repack": bool}`` once the model is loaded;
- then each line ``{"ids": [prompt ids], "seed": s, "tokens": n}``; the answer is
  ``{"ids": [new ids], "tokens": k, "seconds": t}`` (``sample``'s);
- end of input ends the worker.
llama.cpp's own messages go to stderr (the worker's stdout is moved there, its answers keep
the original descriptor), so nothing it prints can break a line of the protocol.

    python bench/llama_cpp_worker.py   # (the row starts it; it waits for the first line)
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

TOP_K = 50


def open_llama(path: Path, threads: int, repack: bool) -> Any:
    """A ``llama_cpp.Llama`` on GGUF ``path`` with the peer's settings: a 2048-token context,
    ``threads`` for decoding and batches, seed 0, quiet.

    ``repack``: weight repacking into llama.cpp's extra CPU buffer types, llama.cpp's default
    (``use_extra_bufts``, which ``Llama`` does not expose). An unpatched native build on a Xeon
    with AMX segfaults with it on the first batch of more than one token (the prompt); the
    caller decides (bench/speed_cpu.py: ``sampler.targets.llamacpp.repacking_safe``).
    """
    import llama_cpp.llama_cpp as raw
    from llama_cpp import Llama

    defaults = raw.llama_model_default_params

    def with_repack() -> Any:
        params = defaults()
        params.use_extra_bufts = repack
        return params

    raw.llama_model_default_params = with_repack
    try:
        return Llama(
            model_path=str(path), n_ctx=2048, n_threads=threads, n_threads_batch=threads,
            verbose=False, seed=0,
        )  # fmt: skip
    finally:
        raw.llama_model_default_params = defaults


def sample(
    llm: Any, ids: list[int], seed: int, tokens: int, stop: Iterable[int]
) -> tuple[list[int], int, float]:
    """Plain sampling at T = 1, top-k 50, top-p 1, no repeat penalty, up to ``tokens`` new ids,
    stopping at an id of ``stop`` (not kept).

    Args:
        ids: (T,) the prompt's ids.
    Returns:
        (the new ids, the decode tokens, their seconds): decode tokens are the ids after the
        first, timed from the first id's arrival to the last's (prefill excluded).
    """
    stops = set(stop)
    llm.set_seed(seed)
    out: list[int] = []
    first = last = 0.0
    for token in llm.generate(ids, top_k=TOP_K, top_p=1.0, min_p=0.0, temp=1.0, reset=True,
                              repeat_penalty=1.0):  # fmt: skip
        last = time.perf_counter()
        if not out:
            first = last
        if token in stops:
            break
        out.append(int(token))
        if len(out) >= tokens:
            break
    return out, max(len(out) - 1, 0), last - first


def serve() -> None:
    """The worker loop (module docstring)."""
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # llama.cpp's prints to stdout land on stderr
    import llama_cpp

    config = json.loads(sys.stdin.readline())
    llm = open_llama(Path(config["model"]), int(config["threads"]), bool(config["repack"]))
    stop = [int(t) for t in config["stop"]]
    answers.write(json.dumps({"version": llama_cpp.__version__, "repack": config["repack"]}))
    answers.write("\n")
    answers.flush()
    for line in sys.stdin:
        asked = json.loads(line)
        new, decoded, seconds = sample(llm, asked["ids"], asked["seed"], asked["tokens"], stop)
        answers.write(json.dumps({"ids": new, "tokens": decoded, "seconds": seconds}) + "\n")
        answers.flush()


if __name__ == "__main__":
    serve()
