"""CPU cost of the verdict's combined test and of the re-aligned test, per scored token.

Times ``detect`` on the 227 human passages (token ids, so the tokenizer is out of the
measurement) three ways, interleaved, best of ``ROUNDS`` rounds: the pipeline as it is
(whole text + window scan), and with ``realign=True``; and the window scan alone
(``detector.combined.combined_test``) on the same terms. Writes
``bench/results/detector_realign_cost.json``.

    python -m bench.detector_realign_cost
"""

from __future__ import annotations

import json
import time

import numpy as np

from bench.common import RESULTS
from bench.detector_common import DATA, bench_source, data_home, run_metadata
from detector import DetectOptions, detect
from detector.combined import combined_test
from sampler.models import DEFAULT_MODEL, load_tokenizer

OUT = RESULTS / "detector_realign_cost.json"
ROUNDS = 5


def main() -> None:
    tok = load_tokenizer(DEFAULT_MODEL, data_home())
    source = bench_source()
    with (DATA / "human-pydoc.jsonl").open(encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    ids = [list(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]
    plain_opts, realign_opts = DetectOptions(), DetectOptions(realign=True)
    found = [detect(tok, source, token_ids=i) for i in ids]
    scored = sum(d.num_scored for d in found)
    terms = [d.evidence.terms["aaronson"] for d in found]
    logs = [d.p_value.log_p_value for d in found]
    best: dict[str, float] = {"plain": np.inf, "realign": np.inf, "scan": np.inf}
    for _ in range(ROUNDS):
        for name, opts in (("plain", plain_opts), ("realign", realign_opts)):
            start = time.perf_counter()
            for i in ids:
                detect(tok, source, token_ids=i, options=opts)
            best[name] = min(best[name], time.perf_counter() - start)
        start = time.perf_counter()
        for t, lp in zip(terms, logs, strict=True):
            combined_test(t, lp)
        best["scan"] = min(best["scan"], time.perf_counter() - start)
    per_token = {k: v / scored * 1e6 for k, v in best.items()}
    result = {
        **run_metadata(),
        "machine_load": "2 CPU cores shared with other helpers' test runs; only the ratios "
        "measured interleaved in this run compare",
        "texts": len(ids),
        "scored_tokens": scored,
        "rounds": ROUNDS,
        "us_per_scored_token": per_token,
        "realign_over_plain": per_token["realign"] / per_token["plain"],
        "scan_share_of_plain": per_token["scan"] / per_token["plain"],
    }
    OUT.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(result["us_per_scored_token"]), result["realign_over_plain"])


if __name__ == "__main__":
    main()
