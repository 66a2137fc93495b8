#!/usr/bin/env bash
# The same tokens before and after a change on the CPU real pair: every arm (plain, n-gram, auto, draft-model trees)
# at T = 0 and T = 1 (seeded), 48 tokens of two code prompts, run by each tree's package; stdout compared byte for byte.
# Usage (holds the lock: the 1.5B float32 target and a second such process do not fit together):
#   flock /tmp/cpu-bench.lock bench/same_tokens.sh BEFORE_SRC AFTER_SRC OUT_DIR   (PROMPTS="csv_parser": one)
set -uo pipefail
before=$1 after=$2 out=$3
M=/root/.cache/mtpcli/models P=$(dirname "$0")/../src/mtpcli/bench_prompts/code
T=${T:-$M/qwen2.5-coder-1.5b} D=${D:-$M/qwen2.5-coder-0.5b}  # (T, D: another pair, e.g. a smoke test on SmolLM2)
mkdir -p "$out"
arms=("plain:--draft none" "ngram:--draft ngram" "auto:--draft-model $D"
      "tree:--draft model --draft-model $D --spec-tree 8 --spec-tree-children 3")
same=0 differ=0
for prompt in ${PROMPTS:-csv_parser lru_cache}; do
  for arm in "${arms[@]}"; do
    for temp in 0 1; do
      name=$prompt-${arm%%:*}-t$temp
      for side in before after; do
        src=$before; [ $side = after ] && src=$after
        tmp=$(mktemp -d)  # fresh homes: no kept costs, prefills or run log carried between runs
        XDG_CONFIG_HOME=$tmp/c XDG_DATA_HOME=$tmp/d XDG_CACHE_HOME=$tmp/k PYTHONPATH=$src MTPCLI_NO_LOG=1 \
          python -m mtpcli generate -q --model "$T" ${arm#*:} --prompt-file "$P/$prompt.txt" \
          --max-tokens 48 --temp $temp --seed 7 > "$out/$name.$side" 2> "$out/$name.$side.err"
        echo "$?" > "$out/$name.$side.rc"
        rm -rf "$tmp"
      done
      if cmp -s "$out/$name.before" "$out/$name.after" && [ -s "$out/$name.after" ]; then
        same=$((same + 1)); echo "same    $name ($(wc -c < "$out/$name.after") bytes)"
      else
        differ=$((differ + 1)); echo "DIFFER  $name (rc $(cat "$out/$name.before.rc") / $(cat "$out/$name.after.rc"))"
      fi
    done
  done
done
echo "$same same, $differ differ"
