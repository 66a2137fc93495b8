#!/usr/bin/env bash
# draft = auto against fixed chains on the agent-like workload (bench/history_agent.py) on a lent NVIDIA GPU, real
# SmolLM2-135M 4-bit (docs/perf/auto.md: issue 33's GPU bar); staging: bench/gpu_stage.sh.
#   bash bench/gpu_agent.sh      (results in $OUT/gpu_agent.json)
# The run log, and so the cost table auto keeps, lives in a fresh folder: the runs decide as a user's first runs do.
source "$(dirname "$0")/gpu_stage.sh" gpu_agent
XDG_DATA_HOME=$(mktemp -d) timeout ${LIMIT:-400} python3 bench/history_agent.py /tmp/m/smol4 /tmp/m/smol4 \
    "$OUT/gpu_agent.json" --arms ${ARMS:-ngram-4,history-8,history-16,plain} --every 2 --control-rounds 2
