"""Run under `mtpcli launch -n 2 -- python dist_worker.py TARGET DRAFT OUT`: several runs in one launch (starting
ranks is most of the cost), each through the code `generate --distributed tensor|pipeline` uses; rank 0 writes what
they gave to OUT as JSON:

  greedy-tensor-model, greedy-tensor-none, greedy-pipeline-model: 40 greedy tokens of one prompt;
  seeded-tensor-t1: 60 tokens at T = 1, seed 3, drafted by the draft model (the same seed, the same output);
  t1-exact, t1-wrong: N completions of one prompt at T = 1 with a tensor-sharded target and a draft model on rank 0
  (EOS off, so every row has its first and second token); `wrong` resamples from p instead of the residual
  (helpers.resampled_from_p, the negative control)."""

import dataclasses
import json
import sys

from helpers import copies, gather, resampled_from_p
from mtpcli import config, verify
from mtpcli.distributed import data, group, sharded

N = 2500
PROMPT = "the sea is "


def run(dist, loaded, target, draft_path, n, max_tokens, batch, eos=True, **flags):
    drafting = {} if flags.get("draft") == "none" else {"draft_model": draft_path, "num_draft_tokens": 3}
    cfg = config.resolve(None, {"model": target, **drafting, "max_tokens": max_tokens, "distributed": dist.mode,
                                **flags})
    cfg = config.settle(cfg, False, sharded=True)
    t = loaded[dist.mode]
    d = None
    if dist.root and cfg.draft == "model":
        from mtpcli import models

        d = loaded.get("draft") or loaded.setdefault("draft", models.load(draft_path, "draft model"))
    messages = dist.messages
    engine = sharded.engine(dist, cfg, t, d, batch)
    if not eos:
        engine.eos = set()
    ids = list(t.tokenizer.encode(PROMPT))
    outs = gather(data.watched(dist, engine, copies(ids, n, max_tokens, cfg.seed)), n)
    st = engine.stats
    return {"tokens": outs, "acceptance": st.acceptance_rate, "reached": st.reached, "cycles": engine.cycles,
            "messages": dist.messages - messages, "mode": dist.mode, "size": dist.size,
            "model_collectives_per_pass": dist.extra["model_collectives_per_pass"]}


def main():
    target, draft, out = sys.argv[1:4]
    tensor = group.setup(config.resolve(None, {"model": target, "distributed": "tensor"}), several=False)
    assert tensor.mode == "tensor", "not launched as a group"
    pipeline = dataclasses.replace(tensor, mode="pipeline", extra={})
    loaded = {m.mode: sharded.load_target(target, m.mode, m.group) for m in (tensor, pipeline)}
    got = {}
    for name, dist, draft_kind in [("greedy-tensor-model", tensor, "model"), ("greedy-tensor-none", tensor, "none"),
                                   ("greedy-pipeline-model", pipeline, "model")]:
        got[name] = run(dist, loaded, target, draft, 1, 40, 1, draft=draft_kind, temp=0.0)
    got["seeded-tensor-t1"] = run(tensor, loaded, target, draft, 1, 60, 1, draft="model", temp=1.0, seed=3)
    for law in ("exact", "wrong"):
        if law == "wrong":
            verify.exact = resampled_from_p
        got[f"t1-{law}"] = run(tensor, loaded, target, draft, N, 3, 250, eos=False, draft="model", temp=1.0)
    if tensor.root:
        with open(out, "w") as f:
            json.dump(got, f)


if __name__ == "__main__":
    main()
