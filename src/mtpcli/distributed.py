"""Several processes under `mlx.launch` (`mtpcli launch`): mx.distributed only, no transport of our own.

Modes (`--distributed`; `auto`: `data` with several requests, else `tensor`):

* data: every rank loads the whole target and decodes a share of the requests (balanced by prompt plus output length,
  each rank batching its share); rank 0 gathers every completion and its statistics and writes them in input order.
* tensor / pipeline: the target is loaded with mlx-lm's `sharded_load` across the group. The drafter runs on rank 0
  only; every rank runs the verify pass; the law's verdict (accepted count and next token per row) is decided on rank
  0. One message per cycle, beyond the model's own collectives, carries rank 0's verdict of the last cycle together
  with its drafts for the next (a row about to be prefilled gets the verdict on its own first, so that every rank
  prefills the same rows). Plain decoding needs no message: rank 0's token is broadcast inside the step's graph.

Every wait on the group is watched: a rank that sees no progress for `--distributed-timeout` seconds prints one line and
exits non-zero (the launcher then stops the others). `mtpcli launch` wraps MLX's own launcher and exits with the worst
rank's status (`mlx.launch` itself exits 0 when a rank fails).
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator

from .errors import EXIT_RUNTIME, ModelError, MtpError, UsageError

MODES = ("auto", "data", "tensor", "pipeline")
# what each launcher sets in the ranks' environment (the backend mx.distributed.init(backend="any") will pick)
_BACKEND_ENV = (("NCCL_HOST_IP", "nccl"), ("MLX_JACCL_COORDINATOR", "jaccl"), ("MLX_IBV_DEVICES", "jaccl"),
                ("MLX_HOSTFILE", "ring"), ("OMPI_COMM_WORLD_SIZE", "mpi"), ("PMI_SIZE", "mpi"))


def launched() -> bool:
    """Started by mlx.launch / mpirun (so mx.distributed.init() finds a group)?"""
    return "MLX_RANK" in os.environ or any(k in os.environ for k, _ in _BACKEND_ENV)


def env_rank() -> int:
    for key in ("MLX_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    return 0


def backend_name() -> str:
    return next((name for key, name in _BACKEND_ENV if os.environ.get(key)), "ring" if "MLX_RANK" in os.environ
                else "none")


# ---- the watchdog ------------------------------------------------------------------------------------------------

class Watchdog:
    """A rank that sees no progress for `timeout` seconds while armed says so and exits (the launcher stops the
    others). A thread: collectives release the GIL while they wait."""

    def __init__(self, timeout: float, rank: int):
        self.timeout, self.rank = timeout, rank
        self.deadline: float | None = None
        self.what = ""
        self._lock = threading.Lock()
        threading.Thread(target=self._watch, daemon=True, name="mtpcli-watchdog").start()

    def arm(self, what: str, seconds: float | None = None) -> None:
        with self._lock:
            self.what = what
            self.deadline = time.monotonic() + (seconds or self.timeout)

    kick = arm

    def disarm(self) -> None:
        with self._lock:
            self.deadline = None

    def _watch(self) -> None:
        while True:
            time.sleep(min(1.0, self.timeout / 4))
            with self._lock:
                late = self.deadline is not None and time.monotonic() > self.deadline
                what = self.what
            if late:
                print(f"mtpcli: error: no answer from the other ranks for {self.timeout:g} s "
                      f"({what}); a rank failed or hung (--distributed-timeout)", file=sys.stderr, flush=True)
                os._exit(EXIT_RUNTIME)


# ---- the group ---------------------------------------------------------------------------------------------------

@dataclass
class Dist:
    mode: str  # data | tensor | pipeline
    group: object  # mx.distributed.Group
    rank: int
    size: int
    backend: str
    timeout: float
    watchdog: Watchdog | None = None
    collective_s: float = 0.0  # our own collectives (messages, the gather), as this rank waited for them
    messages: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def root(self) -> bool:
        return self.rank == 0

    def bcast(self, values: list[int] | None, n: int, what: str) -> list[int]:
        """Rank 0's `values` (n ints, padded with zeros) on every rank: an all_sum to which the others add zeros."""
        import mlx.core as mx

        buf = mx.zeros(n, mx.int32) if values is None else mx.array(values + [0] * (n - len(values)), mx.int32)
        t0 = time.perf_counter()
        self.watchdog.arm(what)
        out = mx.distributed.all_sum(buf, group=self.group).tolist()
        self.watchdog.kick(what + " (done)")
        self.collective_s += time.perf_counter() - t0
        self.messages += 1
        return out

    def gather(self, payload: bytes, what: str, seconds: float | None = None) -> list[bytes]:
        """Every rank's bytes, on every rank (two all_gathers: the lengths, then the padded bytes)."""
        import mlx.core as mx
        import numpy as np

        t0 = time.perf_counter()
        self.watchdog.arm(what, seconds)
        lengths = mx.distributed.all_gather(mx.array([len(payload)], mx.int32), group=self.group).tolist()
        width = -(-max(lengths) // 4)  # in int32 words (the dtype every backend gathers)
        buf = np.zeros(width * 4, np.uint8)
        buf[: len(payload)] = np.frombuffer(payload, np.uint8)
        got = mx.distributed.all_gather(mx.array(buf.view(np.int32)), group=self.group)
        got = np.array(got).reshape(self.size, width).view(np.uint8)
        self.watchdog.disarm()
        self.collective_s += time.perf_counter() - t0
        self.messages += 2
        return [got[r, : lengths[r]].tobytes() for r in range(self.size)]

    def record(self, cycles: int) -> dict:
        d = {"mode": self.mode, "size": self.size, "backend": self.backend, "collective_s": self.collective_s,
             "messages": self.messages, "cycles": cycles,
             "collective_ms_per_cycle": 1e3 * self.collective_s / cycles if cycles else 0.0}
        return {**d, **self.extra}


def setup(s, several: bool) -> Dist | None:
    """The group this run is part of, or None for one process (not launched, or a group of one)."""
    v = s.values
    if not launched():
        if v["distributed"] != "auto" and s.origins.get("distributed") == "flag":
            print(f"mtpcli: note: --distributed {v['distributed']} only acts under mlx.launch (mtpcli launch -n N -- "
                  "generate ...); decoding in this one process", file=sys.stderr)
        return None
    import mlx.core as mx

    group = mx.distributed.init()
    if group.size() == 1:
        return None
    mode = v["distributed"]
    if mode == "auto":
        mode = "data" if several else "tensor"
    d = Dist(mode, group, group.rank(), group.size(), backend_name(), float(v["distributed_timeout"]))
    d.watchdog = Watchdog(d.timeout, d.rank)
    quiet_follower(d)
    return d


class _RankStderr:
    """A follower's stderr: its errors only, naming the rank (rank 0 writes everything else)."""

    def __init__(self, rank: int, real):
        self.rank, self.real, self.buf = rank, real, ""

    def write(self, text: str) -> int:
        self.buf += text
        *lines, self.buf = self.buf.split("\n")
        for line in lines:
            if line.startswith(("mtpcli: error", "mtpcli: internal error")):
                self.real.write(line.replace("mtpcli:", f"mtpcli: rank {self.rank}:", 1) + "\n")
                self.real.flush()
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self.real.fileno()


def quiet_follower(dist: Dist) -> None:
    """Only rank 0 writes stdout and the statistics; the others keep their error lines."""
    if dist is not None and not dist.root and not isinstance(sys.stderr, _RankStderr):
        sys.stdout = open(os.devnull, "w")
        sys.stderr = _RankStderr(dist.rank, sys.stderr)


def refuse_stdin(prompt, files, jsonl) -> None:
    """Under mlx.launch every rank reads the same input; the launcher never closes the ranks' stdin."""
    if launched() and prompt is None and not jsonl and (not files or "-" in files):
        raise UsageError("under mlx.launch, give the prompt with --prompt, --prompt-file or --prompts-jsonl "
                         "(stdin is not passed on to the ranks)")


def describe(d: dict) -> str:
    """One stderr / `mtpcli stats` line."""
    line = (f"distributed: {d['mode']} over {d['size']} ranks ({d['backend']}), {d['messages']} collectives of ours "
            f"in {d['collective_s'] * 1e3:.1f} ms")
    if d.get("in_graph"):
        line += (f"; {d['cycles']} plain steps, each with rank 0's token broadcast inside its graph (not timed apart "
                 "from the pass)")
    elif d["mode"] != "data":
        line += f": {d['collective_ms_per_cycle']:.2f} ms per cycle over {d['cycles']} cycles"
        if d.get("model_collectives_per_pass"):
            line += f"; the model's own: {d['model_collectives_per_pass']} per target pass"
    else:
        line += " (the gather, waiting for the slowest rank included); prompts per rank: " + \
            ", ".join(str(x) for x in d.get("prompts_per_rank", []))
    return line


# ---- tensor / pipeline: loading ------------------------------------------------------------------------------

def load_target(name: str, mode: str, group):
    """The target sharded over the group with mlx-lm's sharded_load (tensor), or split into pipeline stages."""
    import mlx.core as mx
    from mlx_lm.utils import load_model, load_tokenizer, sharded_load

    from . import models

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    path = models.resolve(name)  # (MTP heads are not loaded: --draft mtp is refused)
    try:
        if mode == "tensor" or (not isinstance(path, str) and (path / "model.safetensors.index.json").is_file()):
            tensor, pipe = (group, None) if mode == "tensor" else (None, group)
            model, tokenizer, config = sharded_load(str(path), pipe, tensor, return_config=True)
        else:  # one weights file: mlx-lm's own steps without the per-stage file selection
            from pathlib import Path

            model, config = load_model(Path(path), lazy=True, strict=False)
            if not (hasattr(model, "model") and hasattr(model.model, "pipeline")):
                raise ValueError("The model does not support pipelining")
            model.model.pipeline(group)
            mx.eval(model.parameters())
            tokenizer = load_tokenizer(Path(path), eos_token_ids=config.get("eos_token_id", None))
            mx.eval(mx.distributed.all_sum(mx.array(1.0), stream=mx.cpu, group=group))
    except ValueError as e:
        kind = config_type(path)
        raise ModelError(f"--distributed {mode}: cannot shard model '{name}' ({kind}): {e}; "
                         f"try --distributed {'pipeline' if mode == 'tensor' else 'tensor'} or data") from None
    except MtpError:
        raise
    except Exception as e:  # noqa: BLE001 - the loader raises many kinds; the user needs one line
        raise ModelError(f"cannot load target model '{name}' sharded over the group: "
                         f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    return models.Loaded(model, tokenizer, None if isinstance(path, str) else path, name, config, None)


def config_type(path) -> str:
    try:
        from . import models

        return str(models.read_config(path).get("model_type"))
    except Exception:  # noqa: BLE001
        return "unknown type"


def collectives_per_pass(model, mode: str) -> int:
    """The model's own collectives in one target pass: shard_linear's all_sums (tensor), or the stage hand-offs
    and the final all_gather (pipeline)."""
    if mode == "pipeline":
        return 2
    from mlx.nn.layers.distributed import ShardedToAllLinear

    return sum(1 for _, m in model.named_modules() if isinstance(m, ShardedToAllLinear))


# ---- tensor / pipeline: the engine's side --------------------------------------------------------------------

class Link:
    """The engine's hooks for a target sharded over the group (Engine.link)."""

    def __init__(self, dist: Dist, rows: int, width: int, speculates: bool, sources: list[str]):
        self.d, self.R, self.K = dist, rows, width
        self.chained = not speculates  # plain decoding: steps stay on the device, no messages
        self.sources = [None] + list(sources)
        self.pending = None  # rank 0: the verdict not sent yet
        self.stash = None  # other ranks: the drafts that came with the last verdict
        self.size = 3 + 3 * rows + rows * width

    # message: [has verdict, has drafts, k, source] + n_acc[R] + token[R] + lengths[R] + tokens[R*K]
    def _send(self, verdict, draft, source) -> None:
        R, K = self.R, self.K
        msg = [int(verdict is not None), int(draft is not None), 0, 0] + [0] * (3 * R + R * K)
        if verdict is not None:
            n_acc, tok = verdict
            msg[4: 4 + len(n_acc)], msg[4 + R: 4 + R + len(tok)] = n_acc, tok
        if draft is not None:
            k = draft.k
            if k > K or draft.tokens.shape[0] > R:
                raise RuntimeError(f"draft of {draft.tokens.shape} exceeds the message ({R} rows x {K})")
            msg[2], msg[3] = k, self.sources.index(source) if source in self.sources else 0
            msg[4 + 2 * R: 4 + 2 * R + len(draft.lengths)] = draft.lengths
            rows = draft.tokens.tolist()
            for b, row in enumerate(rows):
                msg[4 + 3 * R + b * K: 4 + 3 * R + b * K + k] = row
        self.d.bcast(msg, len(msg), "sending the verdict and drafts")

    def _receive(self):
        R, K = self.R, self.K
        msg = self.d.bcast(None, 4 + 3 * R + R * K, "waiting for rank 0's verdict and drafts")
        return msg, (msg[4: 4 + R], msg[4 + R: 4 + 2 * R]) if msg[0] else None

    def _draft(self, msg, rows: int):
        import mlx.core as mx

        from .drafters import Draft

        R, K, k = self.R, self.K, msg[2]
        lengths = msg[4 + 2 * R: 4 + 2 * R + rows]
        tokens = [msg[4 + 3 * R + b * K: 4 + 3 * R + b * K + k] for b in range(rows)]
        arr = mx.array(tokens, mx.int32) if k else mx.zeros((rows, 0), mx.int32)
        return Draft(arr, None, lengths, list(lengths)), self.sources[msg[3]]

    def share_draft(self, draft, source):
        """At launch: rank 0 sends its drafts (with its last verdict, if not sent yet); the others take them."""
        if self.chained:
            return draft, source
        if self.d.root:
            self._send(self.pending, draft, source)
            self.pending = None
            return draft, source
        if self.stash is None:
            msg, verdict = self._receive()
            if verdict is not None or not msg[1]:
                raise RuntimeError("rank 0 and this rank disagree on the protocol (a verdict where drafts were due)")
            self.stash = msg
        got, self.stash = self._draft(self.stash, draft.tokens.shape[0]), None
        return got

    def judge(self, cfg, logits, drafts, q, keys, lengths, full=False):
        """Rank 0 judges; the others only make the pass happen (their verdict comes with the next message)."""
        import mlx.core as mx

        from .engine import judge
        from .verify import Verdict

        if self.d.root:
            v, sums, complete = judge(cfg, logits, drafts, q, keys, lengths, full or self.chained)
        else:
            v, sums, complete = Verdict(mx.zeros(logits.shape[0], mx.int32), mx.argmax(logits[:, -1], axis=-1)), [], None
        if self.chained:  # rank 0's token on every rank, inside the step's graph (the others' depends on their pass)
            token = mx.where(mx.array(self.d.root), v.token.astype(mx.int32), 0)
            v = Verdict(v.n_accepted, mx.distributed.all_sum(token, group=self.d.group))
            self.d.messages += 1
        return v, sums, complete

    def share_verdict(self, c) -> None:
        """At the host sync: rank 0 keeps its verdict to send with the next drafts; the others receive it."""
        import mlx.core as mx

        from .verify import Verdict

        self.d.watchdog.kick("verify pass")
        if self.chained:
            return
        if self.d.root:
            self.pending = (c.verdict.n_accepted.tolist(), c.verdict.token.tolist())
            return
        mx.eval(c.verdict.token)  # this rank's part of the pass first, as on rank 0
        msg, verdict = self._receive()
        if verdict is None:
            raise RuntimeError("rank 0 and this rank disagree on the protocol (drafts where a verdict was due)")
        B = len(c.rows)
        c.verdict = Verdict(mx.array(verdict[0][:B], mx.int32), mx.array(verdict[1][:B], mx.int32))
        self.stash = msg if msg[1] else None

    def flush(self) -> None:
        """Before a prefill (every rank must know which rows finished) and at the end: the verdict on its own."""
        self.d.watchdog.kick("prefill")
        if self.d.root and self.pending is not None:
            self._send(self.pending, None, None)
            self.pending = None


def load_models(dist: Dist, s):
    """The sharded target on every rank; the draft model (when the run has one) on rank 0 only."""
    from . import generate as gen
    from . import models

    target = load_target(s.values["model"], dist.mode, dist.group)
    gen.settle_draft(s, target)
    v = s.values
    if v["draft"] == "mtp":
        raise UsageError(f"--draft mtp is not supported with --distributed {dist.mode} yet (use --draft model, "
                         "ngram or none)")
    draft = None
    if dist.root and (v["draft"] == "model" or (v["draft"] == "auto" and v["draft_model"])):
        draft = models.load(v["draft_model"], "draft model")
        models.check_pair(target, draft)
    return target, draft


def follower(speculates: bool, needs_hidden: bool):
    """The drafter of a rank other than 0: it drafts nothing (rank 0's drafts arrive with the messages), but says
    what rank 0's drafter says: whether it speculates and needs the target's hidden states."""
    from .drafters import NoDraft

    d = NoDraft()
    d.name, d.speculates, d.needs_hidden = "follower", speculates, needs_hidden
    return d


def sharded_engine(dist: Dist, s, target, draft, batch_size: int, store=None):
    """The engine of a tensor or pipeline run: rank 0's as usual, the others' without a drafter, with rank 0's batch
    size and draft width (sent once)."""
    from . import generate as gen
    from .controller import FixedWidth
    from .engine import Engine

    v = s.values
    engine = gen.build_engine(s, target, draft, batch_size, store) if dist.root else None
    width = max(v["n_max"] or 0, v["num_draft_tokens"])
    mine = [engine.batch_size, int(engine.drafter.speculates), int(engine.drafter.needs_hidden), width] \
        if dist.root else None
    rows, speculates, hidden, width = dist.bcast(mine, 4, "starting")[:4]
    if not dist.root:
        engine = Engine(target.model, follower(bool(speculates), bool(hidden)), FixedWidth(0),
                        target.tokenizer.eos_token_ids, gen.decode_config(s), rows)
    sources = gen.auto_sources(s, target) if v["draft"] == "auto" else [v["draft"]]
    engine.link = Link(dist, rows, width, bool(speculates), sources)
    dist.extra["in_graph"] = not speculates
    dist.extra["model_collectives_per_pass"] = collectives_per_pass(target.model, dist.mode)
    return engine


# ---- data: shares of the requests ------------------------------------------------------------------------------

def shares(requests: list, size: int) -> list[list]:
    """Longest first to the least loaded rank (load: prompt plus output tokens); each share in input order."""
    load = [0] * size
    out: list[list] = [[] for _ in range(size)]
    for r in sorted(requests, key=lambda r: (-(len(r.prompt) + r.max_tokens), r.index)):
        k = min(range(size), key=lambda i: (load[i], i))
        out[k].append(r)
        load[k] += len(r.prompt) + r.max_tokens
    return [sorted(x, key=lambda r: r.index) for x in out]


def events(dist: Dist, engine, requests: list) -> Iterator:
    """The events gen.run writes: tensor/pipeline, the engine's own (watched); data, this rank's share decoded, then
    on rank 0 every request's completion in input order (and every rank's statistics in engine.runs)."""
    from .engine import Event

    if dist.mode != "data":
        dist.watchdog.arm("the first verify pass")
        try:
            yield from engine.generate(requests)
            engine.link.flush()
        except RuntimeError as e:  # the backend's own word for a peer that went away ("[ring] connection ... lost")
            raise lost(e) from None
        finally:
            dist.watchdog.disarm()
        return
    mine = shares(requests, dist.size)[dist.rank]
    done: dict[int, list] = {}
    error = None
    t0 = time.perf_counter()
    try:
        for ev in engine.generate(mine):
            row = done.setdefault(ev.request, [[], None])
            row[0].extend(ev.tokens)
            row[1] = ev.finish_reason or row[1]
    except MtpError as e:
        error = str(e)
    except Exception as e:  # noqa: BLE001 - reported by rank 0 as this rank's failure
        error = f"{type(e).__name__}: {e}"
    if error and not dist.root:  # said at once too: the gather may wait long for the other ranks
        print(f"mtpcli: error: rank {dist.rank}: {error}", file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - t0
    payload = pickle.dumps({"rank": dist.rank, "done": done, "runs": {i: engine.runs.get(i) for i in done},
                            "cycles": engine.cycles, "error": error, "prompts": len(mine), "wall_s": elapsed})
    try:
        parts = [pickle.loads(p) for p in dist.gather(payload, "gathering the completions", dist.timeout + elapsed)]
    except RuntimeError as e:
        raise lost(e) from None
    dist.extra["prompts_per_rank"] = [p["prompts"] for p in parts]
    dist.extra["wall_s_per_rank"] = [p["wall_s"] for p in parts]
    dist.extra["failed_ranks"] = {p["rank"]: p["error"] for p in parts if p["error"]}
    if not dist.root:
        return
    engine.cycles = sum(p["cycles"] for p in parts)
    failed = {}
    for p in parts:
        engine.runs.update({i: r for i, r in p["runs"].items() if r is not None})
        if p["error"]:
            print(f"mtpcli: error: rank {p['rank']} failed: {p['error']}", file=sys.stderr, flush=True)
            for r in shares(requests, dist.size)[p["rank"]]:
                failed[r.index] = f"rank {p['rank']} failed: {p['error']}"
    rows = {i: row for p in parts for i, row in p["done"].items()}
    for r in requests:
        if r.index in failed and r.index not in rows:
            dist.extra.setdefault("failed_requests", []).append(r.index)
            yield Event(r.index, [], "error")
            continue
        tokens, finish = rows.get(r.index, ([], "error"))
        yield Event(r.index, tokens, finish or "length")


def lost(e: Exception) -> Exception:
    """A backend error that says a peer went away, as one line; any other error as it is (this rank's own)."""
    msg = str(e).splitlines()[0] if str(e) else type(e).__name__
    if not any(w in msg.lower() for w in ("connection", "lost", "closed", "reset", "broken pipe", "nccl")):
        return e
    return MtpError(f"lost the other ranks ({msg}): another rank failed or was stopped", EXIT_RUNTIME)


# ---- mtpcli launch -------------------------------------------------------------------------------------------

def launch(n: int, hosts: str | None, hostfile: str | None, backend: str | None, python: str | None,
           extra: list[str], command: list[str], commands: set[str]) -> int:
    """MLX's own launcher (mlx._distributed_utils.launch), recording every rank's exit status; returns the worst."""
    import mlx._distributed_utils.launch as L

    if not command:
        raise UsageError("mtpcli launch: give the command after --, e.g. mtpcli launch -n 2 -- generate -p 'hi'")
    if hosts and hostfile:
        raise UsageError("mtpcli launch: give --hosts or --hostfile, not both")
    if hostfile and not os.path.isfile(hostfile):
        raise UsageError(f"--hostfile {hostfile}: no such file")
    if command[0] in commands:  # an mtpcli command: every rank runs `python -m mtpcli ...`
        command = ["-m", "mtpcli", *command]
        python = python or sys.executable
    statuses: dict[int, tuple] = {}
    original = L._launch_with_io

    def recording(command_class, arguments, verbose):
        class Recorded(command_class):
            def __init__(self, rank, *args, **kwargs):
                super().__init__(rank, *args, **kwargs)
                self._rank, self._stopped = rank, False
                quiet_stdin(self._process)

            def terminate(self):  # the launcher stops the other ranks once one has failed
                self._stopped = True
                return super().terminate()

            @property
            def exit_status(self):
                status = super().exit_status
                code = status[0]  # stopped by the launcher: its SIGTERM ended the rank (not an exit of its own)
                statuses[self._rank] = (code, bool(status[1]) or (self._stopped and code in (None, -15)))
                return status

        return original(Recorded, arguments, verbose)

    mpirun = []
    original_run = L.run

    def run(cmd, *a, **k):
        result = original_run(cmd, *a, **k)
        if isinstance(cmd, list) and cmd and str(cmd[0]).endswith("mpirun") and "--" in cmd:
            mpirun.append(result.returncode)
        return result

    local = not hosts and not hostfile and backend in (None, "ring") and not any(
        x in ("-p", "--starting-port") or x.startswith("--starting-port=") for x in extra)
    if local and n > 1:  # ranks on this machine only: ports nobody else uses (MLX's default is one fixed port),
        extra = [*extra, "--starting-port", str(free_ports(n))]  # and the cores shared out between the ranks' BLAS
        if "OPENBLAS_NUM_THREADS" not in os.environ:
            extra += ["--env", f"OPENBLAS_NUM_THREADS={max(1, (os.cpu_count() or 1) // n)}"]
    argv = ["mlx.launch", "-n", str(n)]
    argv += ["--hosts", hosts] if hosts else []
    argv += ["--hostfile", hostfile] if hostfile else []
    argv += ["--backend", backend] if backend else []
    argv += ["--python", python] if python else []
    argv += [*extra, "--", *command]
    os.dup2(os.pipe()[0], 0)  # the ranks read no stdin (refuse_stdin); MLX's launcher polls ours: an empty pipe
    saved = sys.argv
    L._launch_with_io, L.run, sys.argv = recording, run, argv
    try:
        L.main()
    except SystemExit as e:  # argparse: the launcher's own usage error (already printed)
        if e.code not in (0, None):
            return 2
    finally:
        L._launch_with_io, L.run, sys.argv = original, original_run, saved
    if mpirun:
        return mpirun[-1]
    return worst(statuses)


def quiet_stdin(process) -> None:
    """MLX's launcher polls each rank's stdin pipe for writability, which an empty pipe always is: each rank's thread
    would spin a core. The ranks read no stdin: give them EOF, and the poll a pipe that is full (never writable)."""
    process.stdin.close()
    r, w = os.pipe()
    os.set_blocking(w, False)
    try:
        while True:
            os.write(w, b"\0" * 65536)
    except BlockingIOError:
        pass
    process.stdin = os.fdopen(w, "wb", buffering=0)
    process._mtpcli_full_pipe = r  # (its read end stays open, or the write end would be "writable": broken)


def free_ports(n: int) -> int:
    """The first of n consecutive free TCP ports on this machine."""
    import random
    import socket

    for _ in range(200):
        start = random.randint(20000, 60000 - n)
        try:
            socks = []
            for port in range(start, start + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return start
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    return 32323


def worst(statuses: dict[int, tuple]) -> int:
    """The worst exit status of the ranks that ended by themselves (those the launcher stopped after another rank
    failed only count when no rank failed by itself); a signal N counts as 128 + N. One line names the rank."""
    own = {r: code for r, (code, killed) in statuses.items() if not killed and code not in (None, 0)}
    stopped = {r: code for r, (code, killed) in statuses.items() if killed or code is None}
    pick = own or stopped
    if not pick:
        return 0
    status = lambda c: 128 + (-c) if c is not None and c < 0 else (c or 1)  # noqa: E731
    rank = max(pick, key=lambda r: (status(pick[r]), -r))
    code = pick[rank]
    how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with status {code}"
    others = sorted(set(stopped) - {rank})
    tail = f"; the launcher stopped rank{'s' if len(others) > 1 else ''} {', '.join(map(str, others))}" if others and own else ""
    print(f"mtpcli: error: rank {rank} {how}{tail}", file=sys.stderr, flush=True)
    return status(code)
