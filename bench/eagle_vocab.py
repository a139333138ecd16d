"""Narrow an eagle head's draft vocabulary to the tokens with the most teacher probability.

A drafting level reads the LM-head rows of the draft vocabulary: with 8-bit rows on the CPU the
16,384 rows of the trained head are 9.4 MB, two thirds of a level's bytes, and right after a
target forward they come from memory, not the caches. Most of the target's probability sits on
far fewer tokens. This ranks the head's draft tokens by the target's processed law (T = 1,
top-k 50) summed over the positions of one generation per prompt of the head's own
training prompts (``provenance.json``: ``train_prompt_ids``, train split only), keeps the
``--size`` first, and writes the head with that draft vocabulary
(``sampler.training.eagle_distill.narrowed``: the same weights) to ``--out``, its provenance
extended with the ranking and the coverage (mean teacher probability on the kept tokens, an
upper bound on one draft's acceptance) on those positions and on the head's validation prompts.

    python -m bench.eagle_vocab --head DIR --size 4096 --out DIR [--tokens 128]

Then ``python -m bench.drafters --eagle NAME=DIR`` measures it in the real decoder.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path
from typing import Any

import torch

from bench.common import PROMPT_FILES, environment, prompts_by_hash
from keyed import KeyedSource, Secret
from sampler.completion import chat_prompt_ids
from sampler.decoder import SamplerConfig, generate
from sampler.drafters.eagle import EagleHead
from sampler.models import DEFAULT_MODEL, LoadedModel, load_model
from sampler.processing import Processing, process
from sampler.training.eagle_distill import narrowed, teacher_mass

TOP_K = 50


def prompts_with_ids(ids: list[str]) -> list[dict[str, Any]]:
    """The prompt records of ``ids`` (from the shared prompt files), in that order.

    Raises:
        SystemExit: an id in none of the files.
    """
    rows = {row["id"]: row for name in PROMPT_FILES for row in prompts_by_hash(name)}
    missing = [i for i in ids if i not in rows]
    if missing:
        raise SystemExit(f"prompts not found: {', '.join(missing[:5])}")
    return [rows[i] for i in ids]


def generation_mass(
    loaded: LoadedModel, prompts: list[dict[str, Any]], tokens: int
) -> tuple[torch.Tensor, int]:
    """(V,) float64 teacher probability summed over positions, and the position count: per
    prompt one ``basic-uwm`` generation (a key from the prompt's id, T = 1, top-k 50, up to
    ``tokens`` new tokens), then one target forward over it; at each generated position the
    processed law."""
    target, tokenizer = loaded.target, loaded.tokenizer
    processing = Processing(1.0, TOP_K, 1.0)
    eos = frozenset({tokenizer.eos_token_id})
    mass = torch.zeros(target.vocab_size, dtype=torch.float64)
    positions = 0
    for record in prompts:
        ids = chat_prompt_ids(tokenizer, record.get("prompt"), record.get("messages"))
        secret = Secret(hashlib.sha256(b"eagle-vocab:" + record["id"].encode()).digest())
        config = SamplerConfig("basic-uwm", max_new_tokens=tokens, processing=processing)
        out = generate(target, ids, config, KeyedSource(secret, 4, True, 0), eos_ids=eos)
        chain = list(ids) + list(out.token_ids)
        if len(chain) <= len(ids):
            continue
        logits = target.new_cache().extend(chain[:-1])[len(ids) - 1 :]
        law = process(logits, processing)
        mass += teacher_mass(law.tokens, law.logp.exp(), target.vocab_size)
        positions += logits.shape[0]
    return mass, positions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--head", type=Path, required=True, help="the head to narrow (the trained one)"
    )
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--home", type=Path, default=Path("~/.local/share/poissonmark"))
    parser.add_argument("--model", default=DEFAULT_MODEL)
    args = parser.parse_args()
    torch.set_num_threads(1)
    # before anything is written: --out may be the shipped head's directory
    run = {k: v for k, v in environment().items() if k in ("commit", "dirty_tree", "date")}
    loaded = load_model(args.model, args.home.expanduser(), device="cpu", precision="gguf")
    head = EagleHead.load(args.head, loaded.target.model)
    provenance = json.loads((args.head / "provenance.json").read_text())
    data = provenance["data"]
    own = head.draft_tokens
    if own is None:
        own = torch.arange(head.config.vocab_size)
    if not 1 <= args.size < own.numel():
        raise SystemExit(f"--size must be in [1, {own.numel()})")
    started = time.perf_counter()
    train = prompts_with_ids(data["train_prompt_ids"])
    validation = prompts_with_ids(data["validation_prompt_ids"])
    mass, positions = generation_mass(loaded, train, args.tokens)
    held_mass, held_positions = generation_mass(loaded, validation, args.tokens)
    kept = own[mass[own].argsort(descending=True, stable=True)[: args.size]]

    def coverage(m: torch.Tensor, n: int, tokens: torch.Tensor) -> float:
        return round(float(m[tokens].sum()) / max(n, 1), 5)

    narrowed(head, kept).save(args.out)
    ranking = {
        "made_by": f"python -m bench.eagle_vocab --head {args.head} --size {args.size} "
        f"--tokens {args.tokens}",
        "ranked_on": "one basic-uwm generation per train prompt (T = 1, top-k 50), the "
        "target's processed law summed over its positions",
        "train_prompts": len(train),
        "train_positions": positions,
        "validation_positions": held_positions,
        "max_new_tokens": args.tokens,
        "seconds": round(time.perf_counter() - started, 1),
        **run,
    }
    data["draft_vocabulary"] = {
        "size": args.size,
        "chosen_by": "the trained head's draft tokens with the most teacher probability",
        "coverage_train": coverage(mass, positions, kept),
        "coverage_validation": coverage(held_mass, held_positions, kept),
        "narrowed_from": {
            **{k: v for k, v in data["draft_vocabulary"].items() if k != "narrowed_from"},
            "coverage_train_here": coverage(mass, positions, own),
            "coverage_validation_here": coverage(held_mass, held_positions, own),
        },
        "ranking": ranking,
    }
    (args.out / "provenance.json").write_text(json.dumps(provenance, indent=1) + "\n")
    print(json.dumps(data["draft_vocabulary"], indent=1))


if __name__ == "__main__":
    main()
