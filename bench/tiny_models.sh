#!/usr/bin/env bash
# CI-free benchmark on tiny random models (seconds, no downloads): mtpcli exact against mlx-lm's speculative
# decoding (token matching) and plain decoding, at T=0 and T=1. Tiny models measure overhead, not speed-ups.
# Usage: bench/tiny_models.sh [OUT_DIR]
set -euo pipefail
out=${1:-$(mktemp -d)}
mkdir -p "$out"
PYTHONPATH=tests python3 -c "
from tiny import make_model, noisy_copy
make_model('$out/target', hidden=128, layers=4); noisy_copy('$out/target', '$out/draft', noise=0.1)"
for t in 0 1; do
  mtpcli bench --model "$out/target" --draft-model "$out/draft" --profiles exact --baseline ar --baseline mlx-lm \
    --baseline mlx-lm-plain --prompts src/mtpcli/bench_prompts/code --seeds 3 --max-tokens 64 --temp $t --no-chat --no-log \
    --out "$out/tiny-t$t.json"
done
