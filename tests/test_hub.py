"""Models from the hub as mlx-lm fetches them: a Hugging Face id not in the local cache is downloaded (the files
mlx-lm loads) from HF_ENDPOINT, here a tiny hub served on 127.0.0.1 by the test itself; HF_HUB_OFFLINE=1 refuses,
and a missing repository or an unreachable hub is one line within seconds."""

import hashlib
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tiny import make_model

SHA = "0123456789abcdef0123456789abcdef01234567"
REPO = "tiny-org/tiny-chat"


class Hub(BaseHTTPRequestHandler):
    """The endpoints huggingface_hub's snapshot_download calls: the revision's info, the file tree, each file."""

    files: dict[str, bytes] = {}
    seen: list[str] = []

    def log_message(self, *args):
        pass

    def _send(self, code: int, body: bytes = b"", headers: dict | None = None, head: bool = False):
        self.send_response(code)
        for k, v in {"Content-Length": str(len(body)), **(headers or {})}.items():
            self.send_header(k, v)
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _route(self, head: bool):
        path = self.path.split("?")[0]
        self.seen.append(f"{self.command} {path}")
        missing = {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"}
        if path.startswith("/api/models/"):
            repo, _, rest = path[len("/api/models/"):].partition("/revision/")
            if repo == REPO and rest:
                doc = {"id": REPO, "sha": SHA, "siblings": [{"rfilename": f} for f in self.files]}
                return self._send(200, json.dumps(doc).encode(), {"Content-Type": "application/json"}, head)
            repo, _, rest = path[len("/api/models/"):].partition("/tree/")
            if repo == REPO and rest:
                doc = [{"type": "file", "path": f, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}
                       for f, b in self.files.items()]
                return self._send(200, json.dumps(doc).encode(), {"Content-Type": "application/json"}, head)
            return self._send(404, b'{"error": "Repository not found"}', missing, head)
        prefix = f"/{REPO}/resolve/"
        if path.startswith(prefix):
            name = path[len(prefix):].split("/", 1)[1]
            if name in self.files:
                body = self.files[name]
                return self._send(200, body, {"X-Repo-Commit": SHA, "ETag": f'"{hashlib.sha1(body).hexdigest()}"'},
                                  head)
        return self._send(404, b"not found", missing, head)

    def do_GET(self):
        self._route(head=False)

    def do_HEAD(self):
        self._route(head=True)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    folder = make_model(tmp_path_factory.mktemp("hub") / "model", chat_template=True)
    Hub.files = {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def hub_env(tmp_path, endpoint, **extra):
    return {"HF_ENDPOINT": endpoint, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "", **extra}


def test_a_hub_id_is_downloaded_from_the_hub_then_read_from_the_cache(cli, hub, tmp_path):
    Hub.seen.clear()
    env = hub_env(tmp_path, hub)
    first = cli("generate", "-m", REPO, "-p", "hello", "--max-tokens", "4", "-q", "--no-log", env=env)
    assert first.returncode == 0, first.stderr.decode()
    assert f"downloading {REPO} from {hub}" in first.stderr.decode()
    assert any(s.startswith("GET /tiny-org/tiny-chat/resolve/") for s in Hub.seen)
    snapshot = tmp_path / "hf" / "hub" / "models--tiny-org--tiny-chat" / "snapshots" / SHA
    assert {p.name for p in snapshot.iterdir()} == set(Hub.files)
    Hub.seen.clear()
    again = cli("generate", "-m", REPO, "-p", "hello", "--max-tokens", "4", "-q", "--no-log",
                env={**env, "HF_ENDPOINT": "http://127.0.0.1:9"})  # the cache first: no hub needed
    assert again.returncode == 0, again.stderr.decode()
    assert again.stdout == first.stdout and not Hub.seen and b"downloading" not in again.stderr


def test_hf_hub_offline_refuses_the_download(cli, hub, tmp_path):
    Hub.seen.clear()
    r = cli("generate", "-m", REPO, "-p", "hello", "--no-log", env=hub_env(tmp_path, hub, HF_HUB_OFFLINE="1"))
    err = r.stderr.decode()
    assert r.returncode == 3 and len(err.splitlines()) == 1, err
    assert "HF_HUB_OFFLINE is set" in err and not Hub.seen


def test_a_missing_repository_is_one_line(cli, hub, tmp_path):
    r = cli("generate", "-m", "tiny-org/no-such-model", "-p", "hello", "--no-log", env=hub_env(tmp_path, hub))
    err = r.stderr.decode().splitlines()
    assert r.returncode == 3 and "Traceback" not in r.stderr.decode()
    assert len(err) == 2 and "downloading" in err[0], err  # the announcement, then the one line
    assert "no such repository" in err[1] and "tiny-org/no-such-model" in err[1]


def test_an_unreachable_hub_is_one_line_within_seconds(cli, tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    r = cli("generate", "-m", REPO, "-p", "hello", "--no-log", env=hub_env(tmp_path, f"http://127.0.0.1:{port}"))
    err = r.stderr.decode().splitlines()
    assert r.returncode == 3 and "Traceback" not in r.stderr.decode(), err
    assert len(err) == 2 and "cannot be reached" in err[1], err
    assert time.monotonic() - t0 < 30  # (the process's own start included)
