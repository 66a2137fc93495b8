"""What the tests share: the exact distribution of the first two tokens, an engine run gathered per request, and the
negative controls (a rejection resampled from p instead of the residual; a draft of q's argmaxes judged as drawn)."""

import mlx.core as mx
import numpy as np

from mtpcli import verify
from mtpcli.controller import FixedWidth
from mtpcli.drafters import NoDraft
from mtpcli.drafters.model import ModelDrafter
from mtpcli.drafters.ngram import NgramDrafter
from mtpcli.engine import DecodeConfig, Engine, Request
from mtpcli.sampling import probs

N = 2500  # draws of a chi-square test


def marginals(law, ids, k=2):
    """The exact distributions of the first k tokens after `ids` (k = 2: the first and the second), where
    law(context) is the next token's (a vector over the vocabulary)."""
    out, paths = [], {(): 1.0}
    for _ in range(k):
        dist, deeper = 0.0, {}
        for path, w in paths.items():
            p = law(ids + list(path))
            dist = dist + w * p
            deeper |= {path + (int(x),): w * p[x] for x in np.nonzero(p)[0]} if len(out) + 1 < k else {}
        out.append(dist)
        paths = deeper
    return tuple(out)


def model_law(model, shape):
    """law(context) for `marginals`: `shape` (logits -> a distribution) of the model's next-token logits."""
    return lambda ctx: shape(model(mx.array([ctx]))[0, -1])


def target_marginals(target, ids, sp, k=2):
    """The first k generated tokens' exact distributions under the target alone, sampled with `sp`."""
    return marginals(model_law(target.model, lambda x: np.array(probs(x, sp, full=True))), list(ids), k)


def copies(ids, n, max_tokens, seed):
    """n completions of one prompt (-n): requests 0..n-1, completion c of each."""
    return [Request(c, ids, max_tokens, seed, c) for c in range(n)]


def gather(events, n):
    """The tokens of requests 0..n-1 from a run's events."""
    outs = [[] for _ in range(n)]
    for ev in events:
        outs[ev.request].extend(ev.tokens)
    return outs


def run(eng, requests):
    """Run the engine on `requests` (indexed 0..n-1); one token list per request."""
    return gather(eng.generate(requests), len(requests))


def collect(loaded, drafter, controller, eos, prompt, n=1, batch_size=1, max_tokens=256, seed=0, **cfg):
    """Run the engine on n completions of `prompt` (-n) and return (one token list per completion, the engine)."""
    eng = Engine(loaded.model, drafter, controller, eos, DecodeConfig(**cfg), batch_size=batch_size)
    return run(eng, copies(list(loaded.tokenizer.encode(prompt)), n, max_tokens, seed)), eng


def decode(tiny, prompt, draft=True, width=4, n=1, controller=None, p_min=0.0, eos=None, batch_size=1, **cfg):
    """`collect` on the tiny pair: `draft` True (the draft model), "ngram" or False (plain), at a fixed width
    unless `controller`; eos None: the tokenizer's."""
    target, dmodel = tiny
    if draft == "ngram":
        drafter = NgramDrafter(1, 3)
    else:
        drafter = ModelDrafter(dmodel.model, p_min=p_min) if draft else NoDraft()
    ctrl = controller or FixedWidth(width if draft else 0)
    eos = target.tokenizer.eos_token_ids if eos is None else eos
    return collect(target, drafter, ctrl, eos, prompt, n, batch_size, **cfg)


def argmax_drafts(monkeypatch, drafter_cls):
    """The negative control of a sampled draft: `drafter_cls` proposes its q's most likely tokens as if drawn from q
    (the law's min(1, p/q) of a token q did not draw)."""
    propose = drafter_cls.propose

    def proposed(self, *a, **kw):
        d = propose(self, *a, **kw)
        d.tokens = mx.argmax(d.q, axis=-1).astype(mx.int32)
        return d

    monkeypatch.setattr(drafter_cls, "propose", proposed)


def passes(monkeypatch) -> list[str]:
    """The role of each model pass (cache.LM._run) from now on, in order."""
    from mtpcli.cache import LM

    calls, run = [], LM._run
    monkeypatch.setattr(LM, "_run", lambda self, *a, **k: (calls.append(self.role), run(self, *a, **k))[1])
    return calls


def resampled_from_p(p, q, draft, keys, lengths=None, exact=verify.exact):
    """The negative control of verify.exact: a rejection resamples from p instead of the residual."""
    v = exact(p, q, draft, keys, lengths)
    redo = verify._sample_rows(verify._at(p, v.n_accepted), [mx.random.split(k)[1] for k in keys])
    return verify.Verdict(v.n_accepted, mx.where(v.n_accepted < draft.shape[-1], redo, v.token))


def source_width(plan):
    """A plan's source and width (what a policy's test asserts; its stop is the stop rule's)."""
    return plan.source, plan.width
