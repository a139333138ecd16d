#!/usr/bin/env bash
# Reproduce the eagle heads (sampler.eagle) for SmolLM2-135M-Instruct and bench/results/drafters.*:
# target rollouts of 40 train-split prompts (cached), the ce baseline from a fresh head, MDraft
# post-training from it, held-out tau (bench.train_eagle), then the real decoder's AATPS of
# ngram, the shipped heads and both eagle heads on held-out prompts (bench.drafters). One torch
# thread at the lowest priority; measured on 2 shared cores: rollouts and hidden states ~14 min,
# ce ~2, mdraft ~4, held-out tau ~1, decoder comparison ~9.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
home="${POISSONMARK_HOME:-$HOME/.local/share/poissonmark}"
out="$home/drafters/eagle"
nice -n 19 python -m bench.train_eagle --out "$out" --home "$home" --train-prompts 40 \
  --heldout-prompts 8 --ce-steps 120 --ce-anchors 32 --mdraft-steps 50 --mdraft-anchors 8 \
  --proposals 4 --lr 2e-3 --mdraft-lr 1e-3 --seed 0
nice -n 19 python -m bench.drafters --home "$home" --precision float32 --eagle "eagle-ce=$out/ce" \
  --eagle "eagle-mdraft=$out/mdraft" --prompts 4 --tokens 48 --cells 4x4,8x6
