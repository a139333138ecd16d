#!/usr/bin/env bash
# The main job on the real model: set up, create a key, generate a watermarked answer with MPFR,
# then detect the watermark in the answer's text.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
PROMPT=${1:-"Explain like I'm five: why is the sky blue?"}
KEY=$(poissonmark keys create --json | python -c 'import json,sys; print(json.load(sys.stdin)["key_id"])')
echo "key: $KEY"
poissonmark generate --key "$KEY" --prompt "$PROMPT" --method mpfr --drafts 4 --lookahead 4 \
  --max-new-tokens 128 --json > .demo-generation.json
python -c 'import json; d=json.load(open(".demo-generation.json")); print(d["text"]); s=d["stats"]; print("\n[%d tokens, %d target passes, AATPS %.2f, %.1f tok/s, watermark %s]" % (s["emitted_tokens"], s["target_forward_passes"], s["aatps"], s["tokens_per_second"], d["watermark_applied"]))'
echo
python -c 'import json; print(json.load(open(".demo-generation.json"))["text"], end="")' \
  | poissonmark detect --key "$KEY"
