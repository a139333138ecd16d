#!/usr/bin/env bash
# Rebuild the shipped eagle head (sampler/drafters/eagle_data/smollm2-135m-instruct) and
# bench/results/drafters.*: target rollouts of the train-split prompts with their hidden states
# (bench.eagle_data: 16 per prompt for the first 84 (the ELI5 ones and two summarisation), 8 for
# the other summarisation prompts at T = 1, 2 per prompt at T = 0.7,
# top-k 50), the ce head from a fresh one and MDraft post-training from it (bench.train_eagle),
# its draft vocabulary narrowed to the 4,096 tokens with the most teacher probability
# (bench.eagle_vocab), then the real decoder's AATPS on 20 held-out prompts (bench.drafters).
# Two torch threads. Measured on 2 cores (Intel Xeon with AMX): rollouts ~37 min, ce ~29,
# mdraft ~18, narrowing ~5, drafters ~40.
# The head with the higher validation acceptance (ce; MDraft left it level) is the shipped one.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
home="${POISSONMARK_HOME:-$HOME/.local/share/poissonmark}"
data="$home/drafters/eagle-rollouts"
out="$home/drafters/eagle"
python -m bench.eagle_data --out "$data" --samples 16 --batch 192 --temperatures 1 \
  --max-new-tokens 160 --prompts 84
python -m bench.eagle_data --out "$data" --samples 8 --batch 96 --temperatures 1 \
  --max-new-tokens 160
python -m bench.eagle_data --out "$data" --samples 2 --batch 96 --temperatures 0.7 \
  --max-new-tokens 160
python -m bench.train_eagle --data "$data" --out "$out" --ce-steps 6000 --batch 256 --lr 2e-3 \
  --checkpoint 500 --mdraft-steps 600 --mdraft-anchors 16 --proposals 4 --mdraft-lr 2e-4
python -m bench.eagle_vocab --home "$home" --head "$out/ce" --size 4096 \
  --out sampler/drafters/eagle_data/smollm2-135m-instruct
python -m bench.drafters --home "$home" --eagle "eagle-mdraft=$out/mdraft" --prompts 20 \
  --tokens 128 --temperatures 1 0.7 --cells 4x4,8x6 \
  --cells-for "eagle (shipped)=1x6,2x4,4x4,4x6,8x4,8x6"
