"""Train an EAGLE-3 head (the published layout mtpcli reads: src/mtpcli/eagle.py) for a target, on text that is not
the benchmark's, and write it as a checkpoint folder: config.json + model.safetensors (fc, midlayer.*, norm,
lm_head, d2t, t2d).

The method is EAGLE-3's (Li et al., 2025; SpecForge's llama3_eagle.py): the target is frozen; its layers 1, L/2 - 1
and L - 4 are tapped; the head learns the target's next-token distribution (soft labels over the reduced vocabulary,
the `--draft-vocab` most frequent tokens of the training text) with training-time test: step k feeds the head's own
output of step k - 1 with the next teacher token, at RoPE position t + k, attending to step 0's keys up to t and to
its own earlier steps at t only; step k's loss is weighted 0.8^k.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 python tools/train_eagle3.py --model smollm2-135m \
        --out /tmp/smol-eagle3 --minutes 20      (on a CPU: OpenBLAS preloaded, as mtpcli does for itself)

Text: Python's standard library (*.py) and /usr/share/doc (plain-text files), by default."""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import random
import sys
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten

from mtpcli import eagle, models
from mtpcli.cache import split_model, tap


def corpus(roots: list[str], limit_mb: float, seed: int) -> list[str]:
    files = []
    for root in roots:
        files += [f for f in glob.glob(os.path.join(root, "**", "*"), recursive=True)
                  if os.path.isfile(f) and not f.endswith((".gz", ".pyc", ".so", ".png", ".svg", ".html"))]
    random.Random(seed).shuffle(files)
    texts, size = [], 0
    for f in files:
        try:
            t = Path(f).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if len(t) < 200:
            continue
        texts.append(t[:20000])
        size += len(texts[-1])
        if size > limit_mb * 1e6:
            break
    return texts


def sequences(tokenizer, texts: list[str], n: int) -> np.ndarray:
    ids = []
    for t in texts:
        ids += tokenizer.encode(t) + [tokenizer.eos_token_id or 0]
    m = len(ids) // n
    return np.array(ids[: m * n], np.int32).reshape(m, n)


ASKS = {"code": ["Explain what this code does, step by step:\n\n{}", "Write unit tests for this code:\n\n{}",
                 "Rewrite this code to be clearer, and say what you changed:\n\n{}"],
        "text": ["Summarize this text in a few paragraphs:\n\n{}", "What are the main points of this text?\n\n{}",
                 "Write a short explanation of this for a beginner:\n\n{}"]}


def chat_prompts(tokenizer, texts: list[str], n: int, seed: int) -> list[list[int]]:
    """n chat prompts made of the training text (its own snippets asked about), for the target to answer: the
    head then learns the target's answers (EAGLE's self-distillation), not only raw text."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        t = texts[i % len(texts)]
        start = rng.randrange(max(1, len(t) - 1200))
        snippet = t[start : start + rng.randrange(300, 1200)]
        ask = rng.choice(ASKS["code" if "def " in snippet or "import " in snippet else "text"])
        out.append(list(tokenizer.apply_chat_template([{"role": "user", "content": ask.format(snippet)}],
                                                      add_generation_prompt=True)))
    return out


def distill(model, tokenizer, prompts: list[list[int]], max_tokens: int, n: int, batch: int = 512,
            temps: tuple[float, ...] = (0.0, 0.7), keep: str | None = None) -> np.ndarray:
    """The target's own answers to `prompts` (the batches take the temperatures `temps` in turn), each after its
    prompt and closed by EOS only where the answer ended, packed into rows of n tokens (and saved to `keep` after
    every batch, so that a run cut short keeps what it made)."""
    from mlx_lm.generate import batch_generate
    from mlx_lm.sample_utils import make_sampler

    ids, t0 = [], time.time()
    for j, i in enumerate(range(0, len(prompts), batch)):
        part = prompts[i : i + batch]
        r = batch_generate(model, tokenizer, part, max_tokens=max_tokens, return_token_ids=True,
                           sampler=make_sampler(temp=temps[j % len(temps)]), completion_batch_size=batch,
                           prefill_batch_size=min(batch, 64))
        for p, answer in zip(part, r.token_ids):
            ids += p + list(answer) + ([tokenizer.eos_token_id or 0] if len(answer) < max_tokens else [])
        print(f"distilled {i + len(part)} answers, {len(ids)} tokens, {time.time() - t0:.0f}s", file=sys.stderr,
              flush=True)
        if keep:
            np.save(keep, packed(ids, n))
    return packed(ids, n)


def fixed_prompts(tokenizer, data: np.ndarray, n: int, length: int, seed: int) -> np.ndarray:
    """n chat prompts of exactly `length` tokens, each a request (ASKS) about a snippet of the training tokens cut
    to fit: one batch of them needs no padding and no mask (as `distill_fixed` decodes them)."""
    mark, eos = "\x00SNIP\x00", tokenizer.eos_token_id or 0
    rng, flat = np.random.default_rng(seed), data.reshape(-1)
    parts = {}
    for kind, asks in ASKS.items():
        for ask in asks:
            pre, post = tokenizer.apply_chat_template([{"role": "user", "content": ask.format(mark)}],
                                                      add_generation_prompt=True, tokenize=False).split(mark)
            parts.setdefault(kind, []).append((tokenizer.encode(pre, add_special_tokens=False),
                                               tokenizer.encode(post, add_special_tokens=False)))
    if length <= max(len(pre) + len(post) for ps in parts.values() for pre, post in ps) + 16:
        raise SystemExit(f"--fixed-prompts {length}: too short for the template and a snippet")
    out = np.zeros((n, length), np.int32)
    for i in range(n):
        for _ in range(20):  # a snippet within one document (no EOS in it)
            start = int(rng.integers(0, len(flat) - length))
            if eos not in flat[start : start + length]:
                break
        kind = "code" if any(w in tokenizer.decode(flat[start : start + 64].tolist()) for w in ("def ", "import ")) \
            else "text"
        pre, post = parts[kind][int(rng.integers(len(parts[kind])))]
        out[i] = pre + flat[start : start + length - len(pre) - len(post)].tolist() + post
    return out


def distill_fixed(model, prompts: np.ndarray, max_tokens: int, n: int, eos: set[int], batch: int = 1024,
                  temps: tuple[float, ...] = (0.0, 0.7), keep: str | None = None, seconds: float = 1e9) -> np.ndarray:
    """`distill` for prompts of one length: the batch decodes together in plain steps of the target over one
    cache (prefilled by its inner model, whose logits are not needed), with no mask; an answer ends at its EOS."""
    from mlx_lm.models.cache import make_prompt_cache

    inner, _ = split_model(model)
    ids, t0 = [], time.time()
    for j, i in enumerate(range(0, len(prompts), batch)):
        if time.time() - t0 > seconds:
            break
        x, temp = mx.array(prompts[i : i + batch]), temps[j % len(temps)]
        cache = make_prompt_cache(model)
        for at in range(0, x.shape[1] - 1, 128):
            inner(x[:, at : min(at + 128, x.shape[1] - 1)], cache=cache)
            mx.eval([layer.state for layer in cache])
        y, out = x[:, -1], []
        for _ in range(max_tokens):
            logits = model(y[:, None], cache=cache)[:, -1].astype(mx.float32)
            y = mx.argmax(logits, axis=-1) if temp == 0 else mx.random.categorical(logits * (1 / temp))
            mx.async_eval(y)
            out.append(y)
        answers = np.array(mx.stack(out, axis=1))
        for p, a in zip(prompts[i : i + batch], answers):
            a = a.tolist()
            end = next((i for i, t in enumerate(a) if t in eos), None)  # (the first of the model's EOS ids)
            ids += p.tolist() + (a if end is None else a[: end + 1])
        print(f"distilled {i + len(x)} answers, {len(ids)} tokens, {time.time() - t0:.0f}s", file=sys.stderr,
              flush=True)
        if keep:
            np.save(keep, packed(ids, n))
    return packed(ids, n)


def packed(ids: list[int], n: int) -> np.ndarray:
    m = len(ids) // n
    return np.array(ids[: m * n], np.uint16 if max(ids, default=0) < 1 << 16 else np.int32).reshape(m, n)


def head_config(target_cfg: dict, taps, draft_vocab: int, vocab: int, intermediate: int | None) -> dict:
    H = target_cfg["hidden_size"]
    keep = ("num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "rope_scaling",
            "max_position_embeddings")
    return {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": H,
            "num_hidden_layers": 1, "intermediate_size": intermediate or target_cfg["intermediate_size"],
            "vocab_size": vocab, "draft_vocab_size": draft_vocab, "tie_word_embeddings": False,
            **{k: target_cfg[k] for k in keep if target_cfg.get(k) is not None},
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(taps), "use_aux_hidden_state": True}}


def step_losses(head: eagle.Head, embed, feats, tokens, labels, K: int, decay: float = 0.8):
    """Training-time test over K steps: feats (B, n, 3H) at t pair with tokens t + 1 (+k); labels[k] (B, L, Vd)."""
    layer = head.layers[0]
    at = layer.self_attn
    B, n, _ = feats.shape
    L = n - K - 1
    h = head.fc(feats[:, :L])
    keys, vals, total, accs = [], [], 0.0, []
    causal = mx.arange(L)[:, None] >= mx.arange(L)[None]
    diag = mx.eye(L, dtype=mx.bool_)
    for k in range(K):
        e = embed(tokens[:, 1 + k : 1 + k + L])
        normed = layer.hidden_norm(h)
        x = mx.concatenate([layer.input_layernorm(e), normed], axis=-1)
        q = at.q_proj(x).reshape(B, L, at.n_heads, -1).transpose(0, 2, 1, 3)
        kk = at.k_proj(x).reshape(B, L, at.n_kv_heads, -1).transpose(0, 2, 1, 3)
        v = at.v_proj(x).reshape(B, L, at.n_kv_heads, -1).transpose(0, 2, 1, 3)
        q, kk = at.rope(q, offset=k), at.rope(kk, offset=k)
        keys.append(kk)
        vals.append(v)
        mask = mx.concatenate([causal] + [diag] * k, axis=1)
        o = mx.fast.scaled_dot_product_attention(q, mx.concatenate(keys, axis=2), mx.concatenate(vals, axis=2),
                                                 scale=at.scale, mask=mask)
        h1 = (normed if layer.norm_before_residual else h) + at.o_proj(o.transpose(0, 2, 1, 3).reshape(B, L, -1))
        h = h1 + layer.mlp(layer.post_attention_layernorm(h1))
        logits = head.lm_head(head.norm(h))
        p = labels[:, k : k + L]
        total = total + decay ** k * -(p * nn.log_softmax(logits, axis=-1)).sum(-1).mean()
        accs.append((logits.argmax(-1) == p.argmax(-1)).astype(mx.float32).mean())
    return total, accs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--text", nargs="*", default=[os.path.dirname(os.__file__), "/usr/share/doc"])
    ap.add_argument("--text-mb", type=float, default=8.0)
    ap.add_argument("--draft-vocab", type=int, default=16384)
    ap.add_argument("--intermediate", type=int, default=None, help="the head's MLP width (default: the target's)")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--ttt", type=int, default=3, help="training-time-test steps")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--minutes", type=float, default=20.0)
    ap.add_argument("--max-steps", type=int, default=100000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokens", help="token sequences (.npy) to train on instead of --text, as --save-tokens wrote")
    ap.add_argument("--save-tokens", help="only tokenize --text into this .npy (for a machine without the text)")
    ap.add_argument("--save-prompts", help="only write chat prompts made of --text (token ids, JSON) to this file")
    ap.add_argument("--prompts", help="chat prompts (as --save-prompts wrote) for the target to answer first")
    ap.add_argument("--answer-tokens", type=int, default=256, help="tokens of each answer (with --prompts)")
    ap.add_argument("--n-prompts", type=int, default=4096, help="prompts written by --save-prompts, or answered")
    ap.add_argument("--text-share", type=float, default=0.25,
                    help="with --prompts: the share of training rows taken from the raw text (the rest: answers)")
    ap.add_argument("--init", default="random", choices=["random", "target"],
                    help="the head's LM head and norm: random, or the target's own rows (unproven: docs/perf/eagle3.md)")
    ap.add_argument("--fixed-prompts", type=int, default=0, metavar="LENGTH",
                    help="with --save-answers: distill --n-prompts prompts of LENGTH tokens made of --tokens (in "
                         "batches of --distill-batch, for --distill-seconds) instead of --prompts")
    ap.add_argument("--distill-batch", type=int, default=1024)
    ap.add_argument("--distill-seconds", type=float, default=1e9)
    ap.add_argument("--resume", help="start from this head (its weights and its draft vocabulary)")
    ap.add_argument("--save-answers", help="only distill --prompts, keeping the rows (.npy) here after every batch")
    ap.add_argument("--answers", help="distilled rows (.npy files as --save-answers wrote, comma-separated) to mix with --tokens by --text-share")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="weights saved as")
    a = ap.parse_args()
    random.seed(a.seed)
    mx.random.seed(a.seed)
    if a.save_prompts:
        tok = models.load(a.model, "target model").tokenizer
        Path(a.save_prompts).write_text(json.dumps(chat_prompts(tok, corpus(a.text, a.text_mb, a.seed),
                                                                 a.n_prompts, a.seed)))
        return
    target = models.load(a.model, "target model")
    model, tc = target.model, target.config
    V = models.output_size(target)
    if a.tokens:
        data = np.load(a.tokens).astype(np.int32)
        data = data.reshape(-1)[: data.size // a.seq * a.seq].reshape(-1, a.seq)
    else:
        data = sequences(target.tokenizer, corpus(a.text, a.text_mb, a.seed), a.seq)
    if a.fixed_prompts:
        prompts = fixed_prompts(target.tokenizer, data, a.n_prompts, a.fixed_prompts, a.seed)
        eos = set(target.tokenizer.eos_token_ids or [target.tokenizer.eos_token_id or 0])
        np.save(a.save_answers, distill_fixed(model, prompts, a.answer_tokens, a.seq, eos, a.distill_batch,
                                              keep=a.save_answers, seconds=a.distill_seconds))
        return
    if a.prompts or a.answers:  # the target's own answers make most rows: what the head meets when drafting
        if a.answers:
            answers = np.concatenate([np.load(f).astype(np.int32) for f in a.answers.split(",")])
        else:
            prompts = json.loads(Path(a.prompts).read_text())[: a.n_prompts]
            answers = distill(model, target.tokenizer, prompts, a.answer_tokens, a.seq, keep=a.save_answers)
            if a.save_answers:
                return
        keep = int(len(answers) * a.text_share / (1 - a.text_share))
        data = np.concatenate([answers, data[np.random.default_rng(a.seed).permutation(len(data))[:keep]]])
    if a.save_tokens:
        np.save(a.save_tokens, data.astype(np.uint16 if V <= 1 << 16 else np.int32))
        return
    counts = np.bincount(data.ravel(), minlength=V)
    used = np.sort(np.argsort(-counts, kind="stable")[: a.draft_vocab])
    if a.resume:  # (its vocabulary, not this text's)
        d2t = np.array(mx.load(str(Path(a.resume) / "model.safetensors"))["d2t"])
        used = np.arange(len(d2t)) + d2t
    Vd = len(used)
    print(f"{data.shape[0]} sequences of {a.seq} tokens; draft vocabulary {Vd} of {V} covers "
          f"{counts[used].sum() / counts.sum():.1%} of the text", file=sys.stderr)
    taps = eagle.default_taps(len(model.layers))
    cfg = head_config(tc, taps, Vd, V, a.intermediate)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    from mlx_lm.models import llama
    args = llama.ModelArgs.from_dict({**cfg, "hidden_size": tc["hidden_size"]})
    head = eagle.Head(args, len(taps) * tc["hidden_size"], Vd, False, False)
    if a.resume:
        w = mx.load(str(Path(a.resume) / "model.safetensors"))
        head.load_weights([(k.replace("midlayer.", "layers.0.", 1), v.astype(mx.float32)) for k, v in w.items()
                           if k not in ("d2t", "t2d")])
    elif a.init == "target":
        init_from_target(head, model, used)
    step = train(model, head, taps, used, data, a.minutes, a.max_steps, a.batch, a.ttt, a.lr, a.seed)
    save(head, used, V, out, getattr(mx, a.dtype))
    print(json.dumps({"out": str(out), "steps": step, "minutes": a.minutes, "tokens_seen": step * a.batch * a.seq,
                      "draft_vocab": Vd}))


def init_from_target(head: eagle.Head, model, used: np.ndarray) -> None:
    """Start the head's LM head and final norm as the target's own (its output rows of the draft vocabulary): the
    head then only has to learn the next hidden state, not a new output space."""
    inner, out = split_model(model)
    H = head.norm.weight.shape[0]
    rows = out(mx.eye(H, dtype=head.norm.weight.dtype))[:, mx.array(used, dtype=mx.int32)].T
    head.lm_head.weight = rows.astype(head.lm_head.weight.dtype)
    if getattr(inner, "norm", None) is not None:
        head.norm.weight = inner.norm.weight.astype(head.norm.weight.dtype)
    mx.eval(head.parameters())


def train(model, head: eagle.Head, taps, used: np.ndarray, data: np.ndarray, minutes: float, max_steps: int,
          batch: int, ttt: int, lr: float, seed: int = 0, log=sys.stderr) -> int:
    """Train `head` over the frozen `model` on token sequences `data` (m, n) until the time or the steps run out
    (AdamW, cosine decay to a tenth); returns the steps taken."""
    inner, _ = split_model(model)
    model.freeze()
    sink = tap(model, taps)
    ids = mx.array(used, dtype=mx.int32)

    def loss_fn(head, feats, x, labels):
        return step_losses(head, inner.embed_tokens, feats, x, labels, ttt)

    grad = nn.value_and_grad(head, loss_fn)
    opt = optim.AdamW(learning_rate=lr, weight_decay=0.0)
    rng = np.random.default_rng(seed)
    t0, step = time.time(), 0
    while time.time() - t0 < minutes * 60 and step < max_steps:
        x = mx.array(data[rng.choice(len(data), batch, replace=len(data) < batch)])
        logits = model(x)  # the frozen target: its tapped states, and its distributions over the draft vocabulary
        feats = mx.concatenate([sink[i] for i in taps], axis=-1)
        labels = mx.softmax(logits[:, 1:][..., ids].astype(mx.float32), axis=-1)  # at t: after token t + 1
        frac = min(1.0, max(step / max_steps, (time.time() - t0) / (minutes * 60)))
        opt.learning_rate = lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        (loss, accs), g = grad(head, mx.stop_gradient(feats), x, mx.stop_gradient(labels))
        opt.update(head, g)
        mx.eval(head.parameters(), opt.state, loss, accs)
        if log is not None and step % 20 == 0:
            print(f"step {step} {time.time() - t0:.0f}s loss {loss.item():.3f} top-1 agreement by step "
                  + " ".join(f"{x.item():.2f}" for x in accs), file=log, flush=True)
        step += 1
    return step


def save(head: eagle.Head, used: np.ndarray, vocab: int, out: Path, dtype=mx.float32) -> None:
    """The published layout: midlayer.*, d2t (draft id + d2t = target id), t2d (the target ids it has)."""
    w = {k.replace("layers.0.", "midlayer.", 1): v.astype(dtype) for k, v in tree_flatten(head.parameters())}
    w["d2t"] = mx.array(used - np.arange(len(used)), dtype=mx.int64)
    t2d = np.zeros(vocab, bool)
    t2d[used] = True
    w["t2d"] = mx.array(t2d)
    mx.save_safetensors(str(out / "model.safetensors"), w)


if __name__ == "__main__":
    main()
