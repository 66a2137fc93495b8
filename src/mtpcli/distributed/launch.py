"""`mtpcli launch`: MLX's own launcher (`mlx.launch`), run as it ships in a subprocess, starts the same command on
every rank; each rank runs under `rank.py`, which reports how it ended. `mtpcli launch` exits with the worst rank's
status (mlx.launch itself exits 0 when a rank fails) and one line names that rank."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import subprocess
import sys
import threading

from ..errors import UsageError
from .rank import MARK


def launch(n: int, hosts: str | None, hostfile: str | None, backend: str | None, python: str | None,
           extra: list[str], command: list[str], commands: set[str]) -> int:
    if not command:
        raise UsageError("mtpcli launch: give the command after --, e.g. mtpcli launch -n 2 -- generate -p 'hi'")
    if hosts and hostfile:
        raise UsageError("mtpcli launch: give --hosts or --hostfile, not both")
    if hostfile and not os.path.isfile(hostfile):
        raise UsageError(f"--hostfile {hostfile}: no such file")
    runner = shutil.which("mlx.launch") or os.path.join(os.path.dirname(sys.executable), "mlx.launch")
    py = python or sys.executable  # the Python that runs mtpcli (and so the rank wrapper) on every host
    if command[0] in commands:  # an mtpcli command: every rank runs `python -m mtpcli ...`
        command = [py, "-m", "mtpcli", *command]
    elif python:
        command = [python, *command]
    local = not hosts and not hostfile and backend in (None, "ring") and not any(
        x in ("-p", "--starting-port") or x.startswith("--starting-port=") for x in extra)
    if local and n > 1:  # ranks on this machine only: ports nobody else uses (MLX's default is one fixed port),
        extra = [*extra, "--starting-port", str(free_ports(n))]  # and the cores shared out between the ranks' BLAS
        if "OPENBLAS_NUM_THREADS" not in os.environ:
            extra += ["--env", f"OPENBLAS_NUM_THREADS={max(1, (os.cpu_count() or 1) // n)}"]
    argv = [runner, "-n", str(n)]
    for flag, value in (("--hosts", hosts), ("--hostfile", hostfile), ("--backend", backend)):
        if value:
            argv += [flag, value]
    argv += ["--python", py, *extra, "--", "-m", "mtpcli.distributed.rank", *command]
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as e:
        raise UsageError(f"mtpcli launch: cannot run MLX's launcher ({runner}): {e.strerror or e}") from None
    threading.Thread(target=_fill, args=(proc.stdin,), daemon=True).start()
    statuses: dict[int, tuple[int, bool]] = {}
    relay = threading.Thread(target=_relay, args=(proc.stderr, statuses))
    relay.start()
    try:
        code = proc.wait()
    except KeyboardInterrupt:  # the ranks got the Ctrl-C too: they print what they committed, then end
        code = proc.wait()
    relay.join()
    return worst(statuses) if statuses else code


def _fill(pipe) -> None:
    """The ranks read no stdin (generate refuses it under the launcher). mlx.launch relays its stdin to every rank
    and polls each rank's stdin pipe for room to write, which an empty pipe always has: its threads would spin a
    core each. Filled once, the pipes stay full; ours stays open, so its poll waits too."""
    with contextlib.suppress(OSError):  # (a broken pipe included)
        pipe.write(b"\0" * (1 << 18))  # more than any rank's stdin pipe holds
        pipe.flush()


def _relay(stream, statuses: dict) -> None:
    """Copy the ranks' stderr to ours line by line, taking out the status lines of rank.py."""
    out, mark = sys.stderr.buffer, MARK.encode()
    for line in stream:
        line, found, status = line.rstrip(b"\n").partition(mark)
        parts = status.decode(errors="replace").split()
        if len(parts) == 4 and parts[0].isdigit():
            value = int(parts[2])
            statuses[int(parts[0])] = (-value if parts[1] == "signal" else value, parts[3] == "stopped")
        if line or not found:
            out.write(line + b"\n")
            out.flush()


def free_ports(n: int) -> int:
    """The first of n consecutive free TCP ports on this machine."""
    for _ in range(200):
        start = random.randint(20000, 60000 - n)
        with contextlib.ExitStack() as socks:
            try:
                for port in range(start, start + n):
                    socks.enter_context(socket.socket()).bind(("127.0.0.1", port))
            except OSError:
                continue
            return start
    return 32323


def worst(statuses: dict[int, tuple[int, bool]]) -> int:
    """The worst exit status of the ranks that ended by themselves (those the launcher stopped after another rank
    failed only count when no rank failed by itself); a signal N counts as 128 + N. One line names the rank."""
    own = {r: code for r, (code, stopped) in statuses.items() if not stopped and code != 0}
    stopped = {r: code for r, (code, was) in statuses.items() if was}
    pick = own or {r: c for r, c in stopped.items() if c != 0}
    if not pick:
        return 0
    status = lambda c: 128 - c if c < 0 else c  # noqa: E731
    rank = max(pick, key=lambda r: (status(pick[r]), -r))
    code = pick[rank]
    how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
    others = sorted(set(stopped) - {rank})
    tail = f"; the launcher stopped rank{'s' if len(others) > 1 else ''} {', '.join(map(str, others))}" \
        if others and own else ""
    print(f"mtpcli: error: rank {rank} {how}{tail}", file=sys.stderr, flush=True)
    return status(code)
