"""Output constrained by a JSON schema or a Lark grammar (llguidance's matcher): what each position may hold. The
law under it (logits masked before `sampling.shaped`, each position after its own path, forced tokens): README.md,
Constrained output."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np

from .errors import UsageError


# JSON on one line, spaced as json.dumps writes it: a JSONL-safe answer, and the structure between values is forced
COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _checked(grammar: str, where: str) -> str:
    from llguidance import LLMatcher

    bad, messages = LLMatcher.validate_grammar_with_warnings(grammar)
    if bad:
        raise UsageError(f"{where}: {' '.join(messages[0].split())}")
    return grammar


def schema(value, where: str) -> str:
    """A JSON schema (a dict or bool, JSON text, or a file holding it) as a checked grammar; one line if bad."""
    from llguidance import LLMatcher

    if isinstance(value, str):
        text = value
        if not value.lstrip().startswith(("{", "true", "false")):
            try:
                text = Path(value).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as e:
                raise UsageError(f"{where} {value}: cannot read the schema ({getattr(e, 'strerror', None) or e})") \
                    from None
            where = f"{where} {value}"
        try:
            value = json.loads(text)
        except ValueError as e:
            raise UsageError(f"{where}: the schema is not valid JSON ({getattr(e, 'msg', e)})") from None
    if not isinstance(value, (dict, bool)):
        raise UsageError(f"{where}: a JSON schema is an object (or true / false)")
    return _checked(LLMatcher.grammar_from_json_schema(json.dumps(value), overrides=COMPACT), where)


def lark(path: str, where: str = "--grammar") -> str:
    """A Lark grammar file (llguidance's syntax) as a checked grammar."""
    from llguidance import LLMatcher

    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{where} {path}: cannot read the grammar ({getattr(e, 'strerror', None) or e})") from None
    return _checked(LLMatcher.grammar_from_lark(text), f"{where} {path}")


def of_config(cfg) -> str | None:
    """The run's constraint (schema, json or grammar: config.resolve allows one), checked before any model loads."""
    if cfg.schema:
        return schema(cfg.schema, "--schema")
    if cfg.json:
        return schema({}, "--json")
    return lark(cfg.grammar) if cfg.grammar else None


def tokenizer(tok, eos: list[int], vocab: int):
    """llguidance's view of an mlx-lm tokenizer: a fast (Rust) tokenizer's own, else each token's text."""
    import llguidance
    import llguidance.hf

    hf = getattr(tok, "_tokenizer", tok)
    try:
        return llguidance.hf.from_tokenizer(hf, n_vocab=vocab, eos_token=list(eos))
    except ValueError:  # a decoder llguidance does not read (a word-level vocabulary): the tokens' texts
        pass
    special = set(hf.all_special_ids)

    class Tokens:
        eos_token_id, bos_token_id, special_token_ids = list(eos)[0], None, sorted(special)
        tokens = [(b"\xff" if i in special else b"") + hf.decode([i]).encode() for i in range(vocab)]  # (\xff: special)

        def __call__(self, s):
            return hf.encode(s.decode() if isinstance(s, bytes) else s, add_special_tokens=False)

    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(Tokens()), n_vocab=vocab, eos_token=list(eos))


class Guide:
    """A matcher per batch row (None: the row is unconstrained), at the row's committed tokens."""

    def __init__(self, tok, eos, vocab: int):
        self.source, self.eos, self.vocab = tok, list(eos), vocab
        self.tok = None  # built at the first constrained row (a 150k vocabulary takes seconds)
        self.rows: list = []

    @property
    def active(self) -> bool:
        return any(m is not None for m in self.rows)

    def add_rows(self, n: int) -> None:
        self.rows += [None] * n

    def keep_rows(self, rows: list[int]) -> None:
        self.rows = [self.rows[r] for r in rows]

    def start(self, row: int, grammar: str | None) -> None:
        self.rows[row] = None
        if grammar is None:  # (an unconstrained run never imports the matcher)
            return
        from llguidance import LLMatcher

        if self.tok is None:
            self.tok = tokenizer(self.source, self.eos, self.vocab)
        self.rows[row] = LLMatcher(self.tok, grammar, log_level=0)
        if self.rows[row].is_error():
            raise UsageError(f"the constraint: {self.rows[row].get_error()}")

    def _allowed(self, m) -> np.ndarray:
        """(V,) bool: the tokens the matcher allows next; where it allows none (a tokenizer that cannot write the
        value), the model's EOS: the row ends, told incomplete."""
        bits = np.unpackbits(np.frombuffer(m.compute_bitmask(), np.uint8), bitorder="little")[: self.vocab]
        if not bits.any():
            bits[[e for e in self.eos if e < self.vocab] or slice(None)] = 1
        return bits.astype(bool)

    def _after(self, m, path: list[int]) -> np.ndarray | None:
        """The allowed tokens after `path` (the matcher rolled back after), None where the path is not allowed; all
        after an EOS where the value was complete (the row ends there: what follows is never committed)."""
        cut = next((i for i, t in enumerate(path) if t in self.eos), len(path))
        if m.validate_tokens(path[:cut]) < cut:
            return None
        m.consume_tokens(path[:cut])
        out = self._allowed(m) if cut == len(path) else np.ones(self.vocab, bool) if m.is_accepting() else None
        m.rollback(cut)
        return out

    def masks(self, draft) -> tuple[mx.array, list[int]] | None:
        """(B, k+1, V) the allowed tokens at every position of a draft's pass (each after its own path), and per
        row how many leading drafts of its chain are allowed (a tree: its nodes); None for unconstrained rows."""
        if not self.active:
            return None
        k = draft.k
        tokens = draft.tokens.tolist() if k else [[] for _ in self.rows]
        out = np.ones((len(self.rows), k + 1, self.vocab), bool)
        allowed = list(draft.lengths)
        for b, m in enumerate(self.rows):
            if m is None:
                continue
            n = draft.lengths[b]
            paths = [tokens[b][:i] for i in range(n + 1)] if draft.tree is None else \
                [[]] + [[tokens[b][j - 1] for j in draft.tree.path(b, i)] for i in range(1, n + 1)]
            for i, path in enumerate(paths):
                a = self._after(m, path)
                if a is None:  # a drafted token the constraint forbids (restricted p = 0): never accepted
                    if draft.tree is None:
                        allowed[b] = min(allowed[b], i - 1)
                    continue
                out[b, i] = a
        return mx.array(out), allowed

    def along(self, rows: int):
        """The draft's restriction along its own path: call(t, logits) consumes the tokens just drafted (t, (B,);
        None first) and masks the next logits; `close()` rolls the matchers back."""
        return _Along(self)

    def forced(self, caps: list[int]) -> list[list[int]]:
        """Per row, up to caps[b] tokens the constraint forces: the tokenization of the bytes it forces (a key, the
        punctuation between values; llguidance's fast-forward tokens), else the tokens while it allows exactly one
        (the EOS of a complete value)."""
        out = []
        for m, cap in zip(self.rows, caps):
            run = [] if m is None or not cap else self.eos[:1] if m.is_stopped() else m.compute_ff_tokens()[:cap]
            if run:
                out.append(run)
                continue
            while m is not None and len(run) < cap and not m.is_stopped():
                a = self._allowed(m)
                if a.sum() != 1:
                    break
                run.append(t := int(np.argmax(a)))
                if t in self.eos or not m.consume_token(t):  # (the EOS ends the row: nothing follows it)
                    break
            if run:
                m.rollback(len(run) - (run[-1] in self.eos))
            out.append(run)
        return out

    def commit(self, row: int, tokens: list[int]) -> None:
        m = self.rows[row]
        if m is not None and not m.is_stopped():
            m.consume_tokens(tokens[: m.validate_tokens(tokens)])

    def complete(self, row: int) -> bool:
        """The row's output so far is a complete value (or the row is unconstrained)."""
        m = self.rows[row]
        return m is None or m.is_accepting() or m.is_stopped()


def fit(allowed: np.ndarray, width: int) -> np.ndarray:
    """A mask over `width` logits (tokens past the tokenizer's vocabulary are not allowed)."""
    return allowed[..., :width] if allowed.shape[-1] >= width else \
        np.concatenate([allowed, np.zeros(allowed.shape[:-1] + (width - allowed.shape[-1],), bool)], axis=-1)


class _Along:
    def __init__(self, guide: Guide):
        self.guide, self.depth = guide, [0] * len(guide.rows)
        self.live = [m is not None for m in guide.rows]

    def __call__(self, t: mx.array | None, logits: mx.array) -> mx.array:
        if not any(self.live):
            return logits
        drawn = t.tolist() if t is not None else None
        allowed = np.ones((len(self.live), logits.shape[-1]), bool)  # (a draft's vocabulary may be another size)
        for b, m in enumerate(self.guide.rows):
            if not self.live[b]:
                continue
            if drawn is not None:  # (a row past its cap draws its argmax: allowed too, or its walk ends)
                if m.is_stopped() or m.validate_tokens([drawn[b]]) < 1:
                    self.live[b] = False
                    continue
                m.consume_token(drawn[b])
                self.depth[b] += 1
            allowed[b] = fit(self.guide._allowed(m), logits.shape[-1])
        return mx.where(mx.array(allowed), logits, -mx.inf)

    def close(self) -> None:
        for m, d in zip(self.guide.rows, self.depth):
            if d:
                m.rollback(d)
