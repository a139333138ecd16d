"""Peak memory of the largest detect requests the limits allow, through the service's path.

One request = what ``POST /v1/detect`` does after its limits: tokenize (``DetectionPool``'s
``read_input``), every key's Aaronson p and best window, full results of the best
``max_results`` keys (``service.jobs.detection.detect_keys``), the ``DetectResponse`` with the best
key's per-token evidence (``service.jobs.detect_response``, raw: the `evidence` scope's, the
larger), dumped to JSON. Options at their most: every score family, spans,
the re-aligned test, ``max_results`` 100, evidence on. The text is human text of exactly
``max_tokens`` (32,768) tokens; keys are in-memory records (Redis reads are not measured).

Cases: one key; the most keys the default rate limit lets one such request test (its work,
32,768 × (K + 8·min(K, 100)) token·keys, within 600 units of 10,000: K = 20); and 10,000 keys
(``max_keys_per_detect``, allowed only with a raised ``detect_rate_limit``). Each case runs
in a fresh process; its peak is the largest resident set a 5 ms sampler saw during the
request, minus the resident set before it (tokenizer and imports loaded).

Writes ``bench/results/request_memory.json``. Several minutes on two shared cores (the
10,000-key case computes 3.3e8 keyed pivots). Run from the repository root::

    python -m bench.request_memory            # every case
    python -m bench.request_memory --case 32768 20   # one case, its JSON on stdout
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
from typing import Any

import psutil

from bench.common import RESULTS

OUT_JSON = RESULTS / "request_memory.json"
MAX_TOKENS = 32_768
CASES = ((MAX_TOKENS, 1), (MAX_TOKENS, 20), (MAX_TOKENS, 10_000))
MAX_RESULTS = 100


def human_text(tokenizer: Any, tokens: int) -> str:
    """Human text (``data/human-pydoc.jsonl``, repeated as needed) of at most ``tokens``
    tokens after tokenizing, and within 8 of it."""
    from bench.detector_common import DATA

    with (DATA / "human-pydoc.jsonl").open(encoding="utf-8") as f:
        joined = "\n\n".join(json.loads(line)["text"] for line in f)
    ids: list[int] = []
    while len(ids) < tokens + 16:
        ids += tokenizer(joined + "\n\n", add_special_tokens=False)["input_ids"]
    cut = tokens
    while True:
        text = tokenizer.decode(ids[:cut])
        count = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        if count <= tokens:
            assert count >= tokens - 8, count
            return str(text)
        cut -= count - tokens


def request(
    tokenizer: Any, text: str, keys: int, limit_mib: int | None = None
) -> tuple[int, float, int]:
    """One request as the route runs it; (peak resident bytes over the start, seconds, bytes
    of the response's JSON). ``limit_mib``: the address space the request may add
    (``RLIMIT_AS``, set once the sampler thread runs; lifted again afterwards)."""
    import secrets

    from detector.detect import read_input
    from detector.options import DetectOptions
    from detector.scores import SCORE_NAMES
    from keyed.prf import Secret
    from service.jobs.detect_response import detect_response
    from service.jobs.detection import detect_keys
    from service.keys.record import KeyRecord

    records = [
        KeyRecord(
            key_id=f"pmk_{k:016x}", secret=Secret(secrets.token_bytes(32)), tokenizer="sha256:x"
        )
        for k in range(keys)
    ]
    options = DetectOptions(scores=tuple(SCORE_NAMES), spans=True, realign=True)
    process = psutil.Process()
    before = process.memory_info().rss
    peak = before
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, process.memory_info().rss)
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if limit_mib is not None:
        resource.setrlimit(
            resource.RLIMIT_AS, (process.memory_info().vms + limit_mib * 2**20, hard)
        )
    start = time.perf_counter()
    try:
        read = read_input(tokenizer, text, None)
        found = detect_keys(tokenizer, records, options, detailed=MAX_RESULTS, read=read)
        body = detect_response(found, tokens=True, raw=True).model_dump_json()
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    seconds = time.perf_counter() - start
    done.set()
    sampler.join()
    peak = max(peak, process.memory_info().rss)
    return peak - before, seconds, len(body)


def run_case(tokens: int, keys: int, limit_mib: int | None = None) -> dict[str, Any]:
    """One case in this process (call it in a fresh one); with ``limit_mib``, the process's
    address space may grow by at most that much during the request (``RLIMIT_AS``: an
    allocation past it raises ``MemoryError``)."""
    import torch  # the service's detection threads run with one torch thread

    from bench.detector_common import data_home
    from keyed import warm_up
    from sampler.models import DEFAULT_MODEL, load_tokenizer

    torch.set_num_threads(1)
    warm_up()
    tokenizer = load_tokenizer(DEFAULT_MODEL, data_home())
    text = human_text(tokenizer, tokens)
    request(tokenizer, text[:2000], 2)  # first-call allocations (caches, pools) out of the way
    rss = psutil.Process().memory_info().rss
    peak, seconds, body = request(tokenizer, text, keys, limit_mib)
    return {
        "tokens": len(tokenizer(text, add_special_tokens=False)["input_ids"]),
        "keys": keys,
        "peak_mib": round(peak / 2**20, 1),
        "rss_before_mib": round(rss / 2**20, 1),
        "seconds": round(seconds, 2),
        "response_mib": round(body / 2**20, 2),
        "address_space_limit_mib": limit_mib,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", nargs=2, type=int, metavar=("TOKENS", "KEYS"))
    parser.add_argument(
        "--limit-mib", type=int, help="With --case: the address space the request may add."
    )
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(*args.case, limit_mib=args.limit_mib)))
        return
    from bench.detector_common import run_metadata

    rows = []
    for tokens, keys in CASES:
        out = subprocess.run(
            [sys.executable, "-m", "bench.request_memory", "--case", str(tokens), str(keys)],
            check=True,
            capture_output=True,
            text=True,
        )
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    result = {
        "benchmark": "request_memory",
        **run_metadata(),
        "load_average": list(os.getloadavg()),
        "settings": {
            "max_tokens": MAX_TOKENS,
            "max_results": MAX_RESULTS,
            "scores": "all",
            "spans": True,
            "realign": True,
            "evidence": "raw, best key",
        },
        "runs": rows,
        "notes": (
            "peak_mib: the largest resident set a 5 ms sampler saw during one request minus "
            "the resident set before it, in a fresh process after one small warm-up request; "
            "the request is tokenize, detect_keys, detect_response (the DetectResponse) "
            "and its JSON (the HTTP layer's copy of the body, response_mib, comes on top)."
        ),
    }
    OUT_JSON.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
