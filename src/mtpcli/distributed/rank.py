"""What `mtpcli launch` runs on every rank: `python -m mtpcli.distributed.rank CMD...` runs CMD and writes a status
line on stderr as it starts (so that `mtpcli launch` names the ranks that never ended) and as CMD ends; mlx.launch
relays them (over ssh too). The SIGTERM with which the launcher stops the others when one rank fails is passed on to
CMD with a SIGCONT (a stopped CMD would never see it); a CMD still alive GRACE seconds later is killed."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading

MARK = "mtpcli-rank-status:"
GRACE = 3.0


def main(argv: list[str]) -> int:
    rank = next((os.environ[k] for k in ("MLX_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK") if k in os.environ), "?")
    os.write(2, f"{MARK} {rank} started\n".encode())
    # The launcher starts mlx.launch with SIGINT ignored, which CMD would inherit: it gets the default back, so that
    # Ctrl-C reaches it (preexec_fn is safe here: this process has started no thread yet)
    try:
        child = subprocess.Popen(argv, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    except OSError as e:  # no such program (on this host), or not executable: what a shell reports, 127 or 126
        code = 126 if isinstance(e, PermissionError) else 127
        os.write(2, f"mtpcli: error: rank {rank}: cannot run {argv[0]}: {e.strerror or e}\n"
                    f"{MARK} {rank} exit {code} own\n".encode())
        return code
    stopped = threading.Event()

    def stop(signum, _frame):
        stopped.set()
        for sig in (signum, signal.SIGCONT):
            with contextlib.suppress(OSError):
                child.send_signal(sig)
        timer = threading.Timer(GRACE, lambda: child.poll() is None and child.kill())
        timer.daemon = True  # (a CMD that ends sooner does not keep this wrapper GRACE seconds)
        timer.start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (a Ctrl-C reaches CMD itself: its process group is ours)
    code = child.wait()
    how = f"signal {-code}" if code < 0 else f"exit {code}"
    os.write(2, f"{MARK} {rank} {how} {'stopped' if stopped.is_set() else 'own'}\n".encode())
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
