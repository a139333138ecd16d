"""Freeze the keyed PRF: write ``tests/goldens/prf_v{PRF_VERSION}.json``.

Each case maps (secret, label or nonce stream, token u, arrival j) to the context key words
(κ0, κ1), the Philox output words (x0, x1) at counter (u, j, 0, 0), and the uniform U as
``float.hex``. ``tests/keyed/test_goldens.py`` checks every value bit for bit.

Policy (``tests/goldens/README.md``): a failing golden is a protocol break. This script never
overwrites the file of an existing ``PRF_VERSION``; a deliberate change of the construction
bumps ``PRF_VERSION`` and is frozen into a new file, after review.

Run from the repository root::

    python -m tests.goldens.make_goldens          # write prf_v{PRF_VERSION}.json (new only)
    python -m tests.goldens.make_goldens --check  # recompute and compare with the file
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import torch

from keyed.prf import PRF_VERSION, SENTINEL, Secret, label_key, nonce_key
from keyed.tensor import philox4x32_10, uniforms_from_keys

GOLDENS_DIR = Path(__file__).resolve().parent
S = SENTINEL

SECRETS: list[bytes] = [
    bytes(32),  # all zero
    b"\xff" * 32,  # all 0xff
    bytes(range(32)),
    hashlib.sha256(b"poissonmark golden secret").digest(),
]
LABELS: list[tuple[int, ...]] = [
    (0,),
    (S,),
    (49_151,),
    (0, 0, 0, 0),
    (S, S, S, S),
    (S, S, S, 7),
    (1, 2, 3, 4),
    (2**31, 0, 49_151, 1),
    tuple(range(8)),
    (S,) * 8,
]
TOKENS: list[int] = [0, 1, 49_151, 2**31]
# (secret index, nonce, position, token, arrival)
NONCE_CASES: list[tuple[int, int, int, int, int]] = [
    (0, 0, 0, 0, 1),
    (1, 0, 0, 0, 1),
    (2, 1, 0, 1, 2),
    (3, 2**63, 17, 49_151, 8),
    (3, 2**64 - 1, 2**32 - 1, 2**31, 4),
    (2, 123_456_789, 4, 2, 1),
]


def golden_path(version: int = PRF_VERSION) -> Path:
    return GOLDENS_DIR / f"prf_v{version}.json"


def _values(key: tuple[int, int], token: int, arrival: int) -> dict[str, Any]:
    """Philox words and U at counter (token, arrival, 0, 0) under the context key."""
    k0, k1 = (torch.tensor(k, dtype=torch.int64) for k in key)
    c0, c1 = (torch.tensor(c, dtype=torch.int64) for c in (token, arrival))
    zero = torch.tensor(0, dtype=torch.int64)
    x0, x1, _, _ = philox4x32_10((c0, c1, zero, zero), (k0, k1))
    u = uniforms_from_keys(k0, k1, c0, c1).item()
    return {
        "key": list(key),
        "words": [int(x0), int(x1)],
        "u": float.hex(u),
        "u_decimal": repr(u),  # for readers; the test checks "u"
    }


def build_cases() -> list[dict[str, Any]]:
    """The golden cases: every secret with every label, then a few nonce-stream keys."""
    cases: list[dict[str, Any]] = []
    i = 0
    for s, raw in enumerate(SECRETS):
        for label in LABELS:
            token, arrival = TOKENS[i % len(TOKENS)], 1 + (i // len(TOKENS)) % 8
            key = label_key(Secret(raw), label)
            case = {"id": f"s{s}_m{len(label)}_{i}", "kind": "label", "secret": raw.hex()}
            case |= {"label": list(label), "token": token, "arrival": arrival}
            cases.append(case | _values(key, token, arrival))
            i += 1
    for s, nonce, position, token, arrival in NONCE_CASES:
        raw = SECRETS[s]
        key = nonce_key(Secret(raw), nonce, position)
        case = {"id": f"s{s}_nonce_{i}", "kind": "nonce", "secret": raw.hex()}
        case |= {"nonce": nonce, "position": position, "token": token, "arrival": arrival}
        cases.append(case | _values(key, token, arrival))
        i += 1
    return cases


def render(cases: list[dict[str, Any]]) -> str:
    """The JSON document, one case per line so a review diff shows each changed case."""
    lines = ",\n".join("    " + json.dumps(c) for c in cases)
    return (
        "{\n"
        f'  "prf_version": {PRF_VERSION},\n'
        '  "generator": "python -m tests.goldens.make_goldens",\n'
        '  "counter": "(token, arrival, 0, 0)",\n'
        '  "cases": [\n'
        f"{lines}\n"
        "  ]\n"
        "}\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the existing file")
    args = parser.parse_args(argv)
    path = golden_path()
    cases = build_cases()
    text = render(cases)
    if args.check:
        if not path.exists():
            print(f"{path} does not exist", file=sys.stderr)
            return 1
        same = path.read_text() == text
        print(f"{path}: {'matches' if same else 'DIFFERS — protocol break'}")
        return 0 if same else 1
    if path.exists():
        print(
            f"refusing to overwrite {path}: goldens of PRF_VERSION {PRF_VERSION} are frozen; "
            "bump PRF_VERSION for a deliberate change (see tests/goldens/README.md)",
            file=sys.stderr,
        )
        return 1
    path.write_text(text)
    print(f"wrote {path} ({len(cases)} cases)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
