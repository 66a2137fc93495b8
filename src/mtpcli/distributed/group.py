"""The group a run belongs to: found under `mlx.launch`, watched so that no rank waits for ever, quiet on every
rank but 0. `Solo` is the group of one process."""

from __future__ import annotations

import io
import os
import sys
import threading
import time
from dataclasses import dataclass, field

from ..errors import EXIT_RUNTIME, MtpError, UsageError

# what each launcher sets in the ranks' environment (the backend mx.distributed.init(backend="any") will pick)
_BACKEND_ENV = (("NCCL_HOST_IP", "nccl"), ("MLX_JACCL_COORDINATOR", "jaccl"), ("MLX_IBV_DEVICES", "jaccl"),
                ("MLX_HOSTFILE", "ring"), ("OMPI_COMM_WORLD_SIZE", "mpi"), ("PMI_SIZE", "mpi"))


def launched() -> bool:
    """Started by mlx.launch / mpirun (so mx.distributed.init() finds a group)?"""
    return "MLX_RANK" in os.environ or any(k in os.environ for k, _ in _BACKEND_ENV)


def backend_name() -> str:
    default = "ring" if "MLX_RANK" in os.environ else "none"
    return next((name for key, name in _BACKEND_ENV if os.environ.get(key)), default)


class Watchdog:
    """A rank that sees no progress for `timeout` seconds while armed says so and exits (the launcher stops the
    others). A thread: collectives release the GIL while they wait."""

    def __init__(self, timeout: float, rank: int):
        self.timeout, self.rank = timeout, rank
        self.disarm()
        threading.Thread(target=self._watch, daemon=True, name="mtpcli-watchdog").start()

    def arm(self, what: str, seconds: float | None = None) -> None:
        self.armed = (time.monotonic() + (seconds or self.timeout), what)  # one tuple: set and read whole, no lock

    def disarm(self) -> None:
        self.armed = (float("inf"), "")

    def _watch(self) -> None:
        while True:
            time.sleep(min(1.0, self.timeout / 4))
            deadline, what = self.armed
            if time.monotonic() > deadline:
                print(f"mtpcli: error: no answer from the other ranks for {self.timeout:g} s "
                      f"({what}); a rank failed or hung (--distributed-timeout)", file=sys.stderr, flush=True)
                os._exit(EXIT_RUNTIME)


class Solo:
    """One process: no group."""

    mode, size, rank, root, sharded = None, 1, 0, True, False

    def events(self, engine, requests):
        return engine.generate(requests)

    def record(self, cycles: int) -> dict | None:
        return None


@dataclass
class Group:
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

    @property
    def sharded(self) -> bool:
        return self.mode != "data"

    def bcast(self, values: list[int] | None, n: int, what: str) -> list[int]:
        """Rank 0's `values` (n ints, padded with zeros) on every rank: an all_sum to which the others add zeros."""
        import mlx.core as mx

        buf = mx.zeros(n, mx.int32) if values is None else mx.array(values + [0] * (n - len(values)), mx.int32)
        t0 = time.perf_counter()
        self.watchdog.arm(what)
        out = mx.distributed.all_sum(buf, group=self.group).tolist()
        self.watchdog.arm(what + " (done)")
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
        buf = np.frombuffer(payload.ljust(width * 4, b"\0"), np.int32)
        got = np.array(mx.distributed.all_gather(mx.array(buf), group=self.group)).view(np.uint8).reshape(self.size, -1)
        self.watchdog.disarm()
        self.collective_s += time.perf_counter() - t0
        self.messages += 2
        return [got[r, : lengths[r]].tobytes() for r in range(self.size)]

    def events(self, engine, requests):
        """The events the front end writes: the engine's own (watched), or this rank's share in data mode."""
        from .data import events, watched  # (data.py imports the engine: not at import time)

        return (events if self.mode == "data" else watched)(self, engine, requests)

    def record(self, cycles: int) -> dict:
        return {"mode": self.mode, "size": self.size, "backend": self.backend, "collective_s": self.collective_s,
                "messages": self.messages, "cycles": cycles,
                "collective_ms_per_cycle": 1e3 * self.collective_s / cycles if cycles else 0.0, **self.extra}


def setup(cfg, several: bool) -> Group | Solo:
    """The group this run is part of, or Solo for one process (not launched, or a group of one)."""
    if not launched():
        if cfg.distributed != "auto" and cfg.origins.get("distributed") == "flag":
            print(f"mtpcli: note: --distributed {cfg.distributed} only acts under mlx.launch (mtpcli launch -n N -- "
                  "generate ...); decoding in this one process", file=sys.stderr)
        return Solo()
    if _one_host():
        return Solo()
    import mlx.core as mx

    try:
        group = mx.distributed.init()
    except RuntimeError as e:
        raise MtpError(f"cannot join the group of ranks ({backend_name()} backend): {e}", EXIT_RUNTIME) from None
    if group.size() == 1:
        return Solo()
    mode = cfg.distributed if cfg.distributed != "auto" else "data" if several else "tensor"
    g = Group(mode, group, group.rank(), group.size(), backend_name(), float(cfg.distributed_timeout))
    g.watchdog = Watchdog(g.timeout, g.rank)
    if not g.root and not isinstance(sys.stderr, _RankStderr):  # rank 0 alone writes stdout and the statistics
        sys.stdout, sys.stderr = open(os.devnull, "w"), _RankStderr(g.rank, sys.stderr)
    return g


def _one_host() -> bool:
    """A ring of one host (mtpcli launch -n 1): mlx.launch writes it an empty hostfile, which MLX cannot parse."""
    path = os.environ.get("MLX_HOSTFILE")
    if not path or not os.path.isfile(path):
        return False
    with open(path) as f:
        return not f.read().strip()


class _RankStderr(io.TextIOBase):
    """A follower's stderr: its errors only, naming the rank (rank 0 writes everything else)."""

    def __init__(self, rank: int, real):
        self.rank, self.real, self.buf = rank, real, ""

    def write(self, text: str) -> int:
        *lines, self.buf = (self.buf + text).split("\n")
        for line in lines:
            if line.startswith(("mtpcli: error", "mtpcli: internal error")):
                self.real.write(line.replace("mtpcli:", f"mtpcli: rank {self.rank}:", 1) + "\n")
                self.real.flush()
        return len(text)

    def fileno(self) -> int:
        return self.real.fileno()


def refuse_stdin(prompt, files, jsonl) -> None:
    """Under mlx.launch every rank reads the same input; the launcher never closes the ranks' stdin."""
    if launched() and ("-" in (jsonl or ()) or prompt is None and not jsonl and (not files or "-" in files)):
        raise UsageError("under mlx.launch, give the prompt with --prompt, --prompt-file or --prompts-jsonl "
                         "(stdin is not passed on to the ranks)")


def describe(d: dict) -> str:
    """One stderr / `mtpcli stats` line."""
    line = (f"distributed: {d['mode']} over {d['size']} ranks ({d['backend']}), {d['messages']} collectives of ours "
            f"in {d['collective_s'] * 1e3:.1f} ms")
    if d["mode"] == "data":
        prompts = ", ".join(str(x) for x in d.get("prompts_per_rank", []))
        return f"{line} (the gather, waiting for the slowest rank included); prompts per rank: {prompts}"
    if d.get("in_graph"):
        return (f"{line}; {d['cycles']} plain steps, each with rank 0's token broadcast inside its graph (not timed "
                "apart from the pass)")
    line += f": {d['collective_ms_per_cycle']:.2f} ms per cycle over {d['cycles']} cycles"
    if d.get("model_collectives_per_pass"):
        line += f"; the model's own: {d['model_collectives_per_pass']} per target pass"
    return line
