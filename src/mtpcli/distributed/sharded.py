"""A target sharded over the group (tensor: mlx-lm's sharded_load; pipeline: its stages); `Peer`'s ONE message a
cycle (the last verdict with the next drafts; the verdict alone before a prefill): docs/guide.md, Several machines."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.nn.layers.distributed import ShardedToAllLinear

from .. import assemble, models
from ..controller import FixedWidth
from ..drafters import Draft, Drafter
from ..engine import Alone, Engine
from ..errors import ModelError
from ..verify import Judged, Verdict


def load_target(name: str, mode: str, group):
    """The target sharded over the group with mlx-lm's sharded_load (tensor), or split into pipeline stages."""
    from mlx_lm.utils import load_model, load_tokenizer, sharded_load

    path = models.resolve(name)  # (MTP heads are not loaded: --draft mtp is refused)
    try:
        if mode == "tensor" or (not isinstance(path, str) and (path / "model.safetensors.index.json").is_file()):
            tensor, pipe = (group, None) if mode == "tensor" else (None, group)
            model, tokenizer, config = sharded_load(str(path), pipe, tensor, return_config=True)
        else:  # one weights file: mlx-lm's own steps without the per-stage file selection
            model, config = load_model(Path(path), lazy=True, strict=False)
            if not hasattr(getattr(model, "model", None), "pipeline"):
                raise ValueError("The model does not support pipelining")
            model.model.pipeline(group)
            mx.eval(model.parameters())
            tokenizer = load_tokenizer(Path(path), eos_token_ids=config.get("eos_token_id", None))
            mx.eval(mx.distributed.all_sum(mx.array(1.0), stream=mx.cpu, group=group))
    except ValueError as e:
        try:
            kind = str(models.read_config(path).get("model_type"))
        except Exception:  # noqa: BLE001
            kind = "unknown type"
        raise ModelError(f"--distributed {mode}: cannot shard model '{name}' ({kind}): {e}; "
                         f"try --distributed {'pipeline' if mode == 'tensor' else 'tensor'} or data") from None
    except Exception as e:  # noqa: BLE001 - the loader raises many kinds; the user needs one line
        raise ModelError(f"cannot load target model '{name}' sharded over the group: "
                         f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    return models.Loaded(model, tokenizer, None if isinstance(path, str) else path, name, config, None)


def collectives_per_pass(model, mode: str) -> int:
    """The model's own collectives per target pass: shard_linear's all_sums, or (pipeline) the hand-offs and gather."""
    return 2 if mode == "pipeline" else sum(1 for _, m in model.named_modules() if isinstance(m, ShardedToAllLinear))


@dataclass
class Message:
    """Rank 0's word to the other ranks: the last cycle's verdict, the next cycle's drafts, or both."""
    verdict: tuple[list[int], list[int]] | None = None  # per row: drafts accepted, the next token
    lengths: list[int] | None = None  # per row: its drafts (None: no drafts in this message)
    tokens: np.ndarray | None = None  # (rows, k) the drafted tokens
    source: str | None = None


class Wire:
    """A Message as a fixed number of int32 (every rank adds into the same buffer): a header (verdict?, drafts?,
    width, source), then per row its accepted count, next token, draft length, and the drafts padded to `width`."""

    def __init__(self, rows: int, width: int, sources):
        self.rows, self.width, self.sources = rows, width, [None, *sources]
        self.size = 4 + 3 * rows + rows * width

    def _views(self, buf: np.ndarray):
        head, n_acc, token, lengths, tokens = np.split(buf, np.cumsum([4, self.rows, self.rows, self.rows]))
        return head, n_acc, token, lengths, tokens.reshape(self.rows, self.width)

    def pack(self, m: Message) -> list[int]:
        buf = np.zeros(self.size, np.int32)
        head, n_acc, token, lengths, tokens = self._views(buf)
        head[:2] = m.verdict is not None, m.lengths is not None
        if m.verdict is not None:
            n_acc[: len(m.verdict[0])], token[: len(m.verdict[1])] = m.verdict
        if m.lengths is not None:
            rows, k = m.tokens.shape  # (never more than the message holds: rank 0's batch and widest draft)
            head[2:] = k, self.sources.index(m.source) if m.source in self.sources else 0
            lengths[:rows], tokens[:rows, :k] = m.lengths, m.tokens
        return buf.tolist()

    def unpack(self, values: list[int]) -> Message:
        head, n_acc, token, lengths, tokens = self._views(np.array(values, np.int32))
        verdict = (n_acc.tolist(), token.tolist()) if head[0] else None
        if not head[1]:
            return Message(verdict)
        return Message(verdict, lengths.tolist(), tokens[:, : head[2]], self.sources[head[3]])


class Peer(Alone):
    """The engine's peer on every rank of a sharded target (Alone: the one-process peer, whose verdict rank 0 reads)."""

    lookahead = False  # a policy's plain steps are not launched ahead: every step's plan comes with a message

    def __init__(self, group, rows: int, width: int, speculates: bool, sources):
        self.g, self.wire = group, Wire(rows, width, sources)
        self.in_graph = not speculates  # plain decoding: rank 0's token inside each step's graph, no messages
        self.redo = speculates  # (a token already broadcast cannot be judged again: plain steps judge in full)
        self.pending = None  # rank 0: the verdict not sent yet
        self.stash: Message | None = None  # other ranks: the drafts that came with the last verdict

    def _send(self, *drafts) -> None:
        """The verdict not sent yet, with these drafts (lengths, tokens, source) if any."""
        self.g.bcast(self.wire.pack(Message(self.pending, *drafts)), self.wire.size, "sending the verdict and drafts")
        self.pending = None

    def _receive(self) -> Message:
        return self.wire.unpack(self.g.bcast(None, self.wire.size, "waiting for rank 0's verdict and drafts"))

    def share_draft(self, draft: Draft, source):
        """At launch: rank 0 sends its drafts (with its last verdict, if not sent yet); the others take them."""
        if self.in_graph or self.g.root:
            if not self.in_graph:
                self._send(draft.lengths, np.array(draft.tokens), source)
            return draft, source
        m, self.stash = self.stash, None
        if m is None:
            m = self._receive()
            if m.verdict is not None or m.lengths is None:
                raise RuntimeError("rank 0 and this rank disagree on the protocol (a verdict where drafts were due)")
        rows = draft.tokens.shape[0]
        tokens = mx.array(m.tokens[:rows]) if m.tokens.shape[1] else mx.zeros((rows, 0), mx.int32)
        return Draft(tokens, None, m.lengths[:rows], m.lengths[:rows]), m.source

    def judged(self, judged: Judged, logits) -> Judged:
        """Rank 0 judges; the others only make the pass happen (their verdict comes with the next message)."""
        if not self.g.root:
            judged = Judged(Verdict(mx.zeros(logits.shape[0], mx.int32), mx.argmax(logits[:, -1], axis=-1)))
        if self.in_graph:  # rank 0's token on every rank, inside the step's graph (the others' is their pass's)
            token = mx.where(mx.array(self.g.root), judged.verdict.token.astype(mx.int32), 0)
            judged = Judged(Verdict(judged.verdict.n_accepted, mx.distributed.all_sum(token, group=self.g.group)))
            self.g.messages += 1
        return judged

    def verdict(self, judged: Judged, width: int) -> tuple[list[int], list[int]]:
        """At the host sync: rank 0 keeps its verdict to send with the next drafts; the others receive it."""
        self.g.watchdog.arm("verify pass")
        if self.in_graph or self.g.root:
            verdict = super().verdict(judged, width)
            if not self.in_graph:
                self.pending = verdict
            return verdict
        mx.eval(judged.verdict.token)  # this rank's part of the pass first, as on rank 0
        m = self._receive()
        if m.verdict is None:
            raise RuntimeError("rank 0 and this rank disagree on the protocol (drafts where a verdict was due)")
        self.stash = m if m.lengths is not None else None
        rows = judged.verdict.token.shape[0]
        return m.verdict[0][:rows], m.verdict[1][:rows]

    def prefill(self) -> None:
        """Before a prefill (every rank must know which rows finished) and at the end: the verdict on its own."""
        self.g.watchdog.arm("prefill")
        if self.g.root and self.pending is not None:
            self._send()

    end = prefill


class Follower(Drafter):
    """Rank 1+'s drafter: it drafts nothing (rank 0's drafts come with the messages); its flags are rank 0's."""

    name = "follower"

    def __init__(self, speculates: bool, needs_hidden: bool):
        self.speculates, self.needs_hidden = speculates, needs_hidden


def engine(group, cfg, target, draft, batch_size: int, store=None, keep: bool = False):
    """A sharded run's engine: rank 0's as in one process, the others' with a Follower and rank 0's batch and width."""
    eng = assemble.engine(cfg, target, draft, batch_size, store, keep) if group.root else None
    mine = [eng.batch_size, int(eng.drafter.speculates), int(eng.drafter.needs_hidden),
            max(cfg.n_max, cfg.num_draft_tokens)] if group.root else None
    rows, speculates, hidden, width = group.bcast(mine, 4, "starting")[:4]
    if not group.root:
        eng = Engine(target.model, Follower(bool(speculates), bool(hidden)), FixedWidth(0),
                     target.tokenizer.eos_token_ids, assemble.decode_config(cfg), rows)
    eng.peer = Peer(group, rows, width, bool(speculates), cfg.sources)
    group.extra["in_graph"] = not speculates
    group.extra["model_collectives_per_pass"] = collectives_per_pass(target.model, group.mode)
    return eng
