# Shared by the CPU benchmark scripts: the real pair, the T=1 sampler, and `run NAME ARGS...`, which runs
# `mtpcli bench ARGS` and keeps its table in $out/NAME.txt and its full result in $out/NAME.json.
set -euo pipefail
out=${1:-docs/perf/cpu}
mkdir -p "$out"
M="--model qwen2.5-coder-1.5b --draft-model qwen2.5-coder-0.5b --no-log"
T1="--temp 1.0 --top-p 0.95 --top-k 20"
P=src/mtpcli/bench_prompts
run() { name=$1; shift; echo "== $name: mtpcli bench $*" | tee "$out/$name.txt"; mtpcli bench "$@" --out "$out/$name.json" | tee -a "$out/$name.txt"; }
