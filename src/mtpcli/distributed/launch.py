"""`mtpcli launch`: `mlx.launch` as it ships, in a subprocess, each rank under `rank.py`, which reports how it ended;
the worst rank's status, one line naming that rank (README.md, Several machines; mlx.launch exits 0 when one fails)."""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

from ..errors import EXIT_INTERRUPTED, EXIT_RUNTIME, EXIT_TERMINATED, UsageError
from .rank import GRACE, MARK

BACKENDS = ("ring", "mpi", "nccl", "jaccl", "jaccl-ring")  # what mlx.launch accepts
_LOG = re.compile(rb"\x1b\[3\dm(\[(?:INFO|WARN|ERROR)\] .*?) ?\x1b\[0m")  # mlx.launch's own lines, in colour
KILL_AFTER = GRACE + 2.0  # seconds a rank has to end once the job is ending (rank.py kills its command after GRACE)


def launch(n: int, hosts: str | None, hostfile: str | None, backend: str | None, python: str | None,
           extra: list[str], command: list[str], commands: set[str]) -> int:
    if not command:
        raise UsageError("mtpcli launch: give the command after --, e.g. mtpcli launch -n 2 -- generate -p 'hi'")
    if hosts is not None and not all(h.strip() for h in hosts.split(",")):
        raise UsageError(f"--hosts {hosts!r}: an empty host name; give comma-separated hosts, e.g. "
                         "--hosts 192.168.1.2,192.168.1.3")
    if hosts and hostfile:
        raise UsageError("mtpcli launch: give --hosts or --hostfile, not both")
    if hostfile and not os.path.isfile(hostfile):
        raise UsageError(f"--hostfile {hostfile}: no such file")
    if backend is not None and backend not in BACKENDS:
        raise UsageError(f"--backend {backend}: not a backend of mlx.launch; choose one of {', '.join(BACKENDS)}")
    if backend == "mpi" and not shutil.which("mpirun"):  # (mlx.launch would end in a traceback)
        raise UsageError("--backend mpi: no mpirun on PATH; install Open MPI, or choose --backend ring")
    runner = shutil.which("mlx.launch") or os.path.join(os.path.dirname(sys.executable), "mlx.launch")
    here = not hosts and not hostfile  # every rank on this machine (no ssh)
    py = python or sys.executable  # the Python that runs mtpcli (and so the rank wrapper) on every host
    if command[0] in commands:  # an mtpcli command: every rank runs `python -m mtpcli ...`
        command = [py, "-m", "mtpcli", *command]
    elif python:
        command = [python, *command]
    elif "/" not in command[0] and here and not shutil.which(command[0]):
        # (not for a path, which --cwd may move, nor on other hosts: there rank.py says it cannot run the command)
        raise UsageError(f"mtpcli launch: {command[0]!r} is neither an mtpcli command ({', '.join(sorted(commands))}) "
                         "nor a program on PATH")
    local = here and backend in (None, "ring") and not any(
        x in ("-p", "--starting-port") or x.startswith("--starting-port=") for x in extra)
    if local and n > 1:  # ranks on this machine only: ports nobody else uses (MLX's default is one fixed port),
        extra = [*extra, "--starting-port", str(free_ports(n))]  # and the cores shared out between the ranks' BLAS
        for var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):  # (blas.py loads either)
            if var not in os.environ:
                extra += ["--env", f"{var}={max(1, (os.cpu_count() or 1) // n)}"]
    argv = [runner, "-n", str(n)]
    for flag, value in (("--hosts", hosts), ("--hostfile", hostfile), ("--backend", backend)):
        if value:
            argv += [flag, value]
    argv += [*extra, "--", py, "-m", "mtpcli.distributed.rank", *command]  # (mlx.launch's --python: not for mpi)
    # Ranks here: mlx.launch starts with Ctrl-C ignored (the SIGINT we pass on to its group), and goes on relaying
    # what they print as they end instead of dying in a traceback of its own (rank.py gives its command the default
    # back). Not over ssh, which would inherit it, nor for mpirun: each ends its ranks on a SIGINT.
    sigint = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.SIG_IGN if here and backend != "mpi" else sigint)
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    except OSError as e:
        raise UsageError(f"mtpcli launch: cannot run MLX's launcher ({runner}): {e.strerror or e}") from None
    finally:
        signal.signal(signal.SIGINT, sigint)
    threading.Thread(target=_fill, args=(proc.stdin,), daemon=True).start()
    statuses, started = {}, set()  # rank -> (exit code or -signal, stopped by the launcher?); the ranks that started
    relay = threading.Thread(target=_relay, args=(proc.stderr, statuses, started))
    relay.start()
    code, interrupted, killed = _wait(proc, statuses, started)
    relay.join()
    if statuses:  # (a rank the deadline killed, or one that ended without a status, is never a success)
        lost = ", ".join(map(str, sorted(started - set(statuses))))
        if interrupted and not lost and all(c in (0, interrupted, 128 - interrupted) for c, _ in statuses.values()):
            return interrupted  # every rank ended as the signal passed on to it asks (rank 0's own line says so)
        if (code := worst(statuses) or interrupted or (EXIT_RUNTIME if killed else 0)) or not lost:
            return code
        print(f"mtpcli: error: rank {lost} ended without a status (killed from outside?)", file=sys.stderr, flush=True)
        return EXIT_RUNTIME
    if not interrupted and code == 0:  # mlx.launch exits 0 when no rank ran at all (mpirun failing, for one)
        print("mtpcli: error: no rank reported how it ended: the ranks did not start", file=sys.stderr, flush=True)
    return interrupted or (128 - code if code < 0 else code) or EXIT_RUNTIME


def _wait(proc: subprocess.Popen, statuses: dict, started: set) -> tuple[int, int, bool]:
    """mlx.launch's exit status once its process group has ended, 128 + the signal that interrupted us (0: none; it
    is passed on to the group) and whether the group was killed: once a rank failed (mlx.launch then stops the others)
    or we were interrupted, every rank has KILL_AFTER s to end, then what is left (stopped with SIGSTOP, or stuck) gets
    SIGCONT and SIGKILL and one line names the ranks that had not ended (mlx.launch would wait for them for ever)."""
    deadline, interrupted, code = None, 0, None
    while True:
        try:
            if code is None:
                code = proc.wait(timeout=0.2)
            elif not interrupted or not _signal(proc, 0):  # (mlx.launch dies of a SIGTERM before its ranks)
                return code, interrupted, False
            else:
                time.sleep(0.2)
        except subprocess.TimeoutExpired:
            pass
        except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM (see cli.main): passed on to every rank
            interrupted = e.args[0] if e.args else EXIT_INTERRUPTED
            _signal(proc, signal.SIGTERM if interrupted == EXIT_TERMINATED else signal.SIGINT)
            deadline = deadline or time.monotonic() + KILL_AFTER
        if deadline is None and any(c != 0 and not stopped for c, stopped in list(statuses.values())):
            deadline = time.monotonic() + KILL_AFTER  # a rank failed: mlx.launch stops the others
        if deadline is not None and time.monotonic() > deadline:
            left = sorted(started - set(statuses))
            who = f"rank{'s' if len(left) > 1 else ''} {', '.join(map(str, left))}" if left else "the job"
            print(f"mtpcli: error: {who} did not stop within {KILL_AFTER:g} s of the job ending (stopped with "
                  "SIGSTOP, or stuck); killed", file=sys.stderr, flush=True)
            _signal(proc, signal.SIGCONT)
            _signal(proc, signal.SIGKILL)
            return proc.wait(), interrupted, True


def _signal(proc: subprocess.Popen, sig: int) -> bool:
    """Send `sig` to mlx.launch's process group (its ranks on this machine, the ssh to others); False if it is gone."""
    try:
        os.killpg(proc.pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _fill(pipe) -> None:
    """mlx.launch polls each rank's stdin pipe for room to relay its stdin (no rank reads it): an empty pipe always
    has room, so its threads would spin a core each. Filled once, they stay full; ours stays open, so its poll waits."""
    with contextlib.suppress(OSError):  # (a broken pipe included)
        pipe.write(b"\0" * (1 << 18))  # more than any rank's stdin pipe holds
        pipe.flush()


def _relay(stream, statuses: dict, started: set) -> None:
    """Copy the ranks' stderr to ours line by line, taking out the status lines of rank.py, the colour of
    mlx.launch's own lines under NO_COLOR or off a terminal, and the usage that its refusals print (their one line
    of error is ours)."""
    out, mark, usage = sys.stderr.buffer, MARK.encode(), False
    plain = bool(os.environ.get("NO_COLOR")) or not sys.stderr.isatty()
    for line in stream:
        line, found, status = line.rstrip(b"\n").partition(mark)
        if plain:
            line = _LOG.sub(rb"\1", line)
        if not started and (line.startswith(b"usage: mlx.launch") or usage and line.startswith(b" ")):
            usage = True
            continue
        if line.startswith(b"mlx.launch: error: "):
            line = b"mtpcli: error: mlx.launch: " + line.removeprefix(b"mlx.launch: error: ")
        parts = status.decode(errors="replace").split()
        if parts[1:] == ["started"] and parts[0].isdigit():
            started.add(int(parts[0]))
        elif len(parts) == 4 and parts[0].isdigit():
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
