"""What the tests share: the exact distribution of the first two tokens, an engine run gathered per request, the
negative controls (a rejection resampled from p instead of the residual; a draft of q's argmaxes judged as drawn), and
the subprocess tests' look at their processes (Linux /proc) and their signal sent mid-output."""

import os
import time
from pathlib import Path

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


def plain(loaded, prompt, max_tokens):
    """The tokens of `prompt` decoded plainly (no draft): what a greedy speculative run must give."""
    return collect(loaded, NoDraft(), FixedWidth(0), (), prompt, max_tokens=max_tokens)[0][0]


def loaded(paths):
    """(the target, its --draft-model: a model or a trained head) loaded from a pair of folders."""
    from mtpcli import models

    target = models.load(str(paths[0]))
    return target, models.load_draft(str(paths[1]), target)


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


def planned(policy, cycles, update) -> list:
    """The source POLICY plans for one row in each of CYCLES cycles, each followed by UPDATE(source, width)."""
    sources = []
    for _ in range(cycles):
        s, k = source_width(policy.plan([[0]]))
        sources.append(s)
        update(s, k)
    return sources


def timed(fit, truth, widest, outliers=None, cycles=300) -> None:
    """CYCLES cycles added to FIT (costs.CostFit): plain steps, lookup and the draft model in turn at random widths
    below WIDEST (lookup's, the model's), each taking TRUTH's time with 2% noise, and with OUTLIERS (a rate) ten times
    that: a busy machine."""
    rng = np.random.default_rng(0)
    for i in range(cycles):
        lookup, model = int(rng.integers(1, widest[0])), int(rng.integers(1, widest[1]))
        s, k = [(None, 0), ("ngram", lookup), ("model", model)][i % 3]
        slow = 1 if outliers is None else 1 + 9 * (rng.random() < outliers)
        fit.add(s, k, truth.time(s, k) * (1 + 0.02 * rng.standard_normal()) * slow)


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (Linux /proc), nearest first."""
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                kids.setdefault(int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]), []).append(int(d.name))
            except (OSError, IndexError, ValueError):
                pass
    out, todo = [], [pid]
    while todo:
        out += kids.get(todo[0], [])
        todo += kids.get(todo.pop(0), [])
    return out


def rank_of(pid: int) -> int | None:
    """The MLX rank a process runs as (its MLX_RANK), None if it has none or is gone."""
    try:
        env = (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")
    except OSError:
        return None
    return next((int(e[9:]) for e in env if e.startswith(b"MLX_RANK=")), None)


def signalled(p, sig, n: int = 20, seconds: float = 60) -> tuple[bytes, bytes, bytes]:
    """Send SIG to the process P once its stdout gave N bytes (or SECONDS passed): (what came before, the rest of
    stdout, stderr); P is killed if it is still there after that."""
    try:
        os.set_blocking(p.stdout.fileno(), False)
        got, deadline = b"", time.time() + seconds
        while len(got) < n and time.time() < deadline:
            got += p.stdout.read() or b""
            time.sleep(0.05)
        p.send_signal(sig)
        return (got, *p.communicate(timeout=60))
    finally:
        if p.poll() is None:
            p.kill()
