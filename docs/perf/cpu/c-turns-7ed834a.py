import json, os, subprocess, sys, tempfile
sys.path.insert(0, "/work/main/bench")
import chat_loop as cl
from pathlib import Path
text = subprocess.run(["git", "-C", str(cl.ROOT), "show", f"{cl.PREFIX_COMMIT}:{cl.PREFIX_FILE}"], check=True, capture_output=True, text=True).stdout
joined = " \\n ".join(text.splitlines())
prompts = [f"Here is {cl.PREFIX_FILE}, its lines joined by ' \\n ': {joined}  {cl.QUESTIONS[0]}", *cl.QUESTIONS[1:]]
M = "/root/.cache/mtpcli/models/"
flags = ["--model", M + "qwen2.5-coder-1.5b", "--draft-model", M + "qwen2.5-coder-0.5b", "--max-tokens", "24", "--temp", "0"]
tmp = Path(tempfile.mkdtemp()); (tmp / "p1.txt").write_text(prompts[0])
env = cl.env_for(tmp / "home")
for k in range(3):
    go = ["--save", "--prompt-file", str(tmp / "p1.txt")] if k == 0 else ["-c", "-p", prompts[k]]
    wall, out = cl.run([sys.executable, "-m", "mtpcli", "generate", *go, *flags, "-q", "--stats-json", str(tmp / "s.json")], env)
    d = json.loads((tmp / "s.json").read_text())
    print(k + 1, round(wall, 1), {x: (round(v, 2) if isinstance(v, float) else v) for x, v in d.items() if any(w in x for w in ("prefill", "cached", "ttft", "load", "decode_s", "prompt_tokens", "draft_width", "source"))}, flush=True)
