"""Prefills kept on disk (issue 54): a warm run, which resumes from a kept prefix of its prompt, gives the cold run's
tokens at T = 0 and at T = 1 with the same seed, on every cache kind, one row, a ragged batch, -n, with a draft
model, the history and an EAGLE-3 head; a kept state of another model, tokenizer or prefix is never used; and
nothing kept can fail a run or change its text: concurrent runs, damaged, truncated and foreign files, a full or
read-only disk, eviction while another run reads."""

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from typer.testing import CliRunner

from mtpcli import models as loading
from mtpcli import prefix
from mtpcli.cache import LM
from mtpcli.cli import app
from tiny import make_eagle3_head, make_hybrid_model, make_model, make_windowed_model, noisy_copy

STEP = 16  # the prefill chunk in these tests: prompts of ~100 tokens cross several boundaries
BASE = "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\nthe quick brown fox jumps over the lazy dog. "
P1 = BASE + "what does it print?\na: 5\n"
P2 = P1 + "and add(1, 1)?\na:"  # the next turn: P1 and more
KEPT = (len(P1) - 1) // STEP * STEP  # P1's kept state (the target prefills all but the prompt's last token)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("prefix")
    full = make_model(root / "full", max_positions=512)
    return {"full": full, "window": make_windowed_model(root / "window"), "hybrid": make_hybrid_model(root / "hybrid"),
            "draft": noisy_copy(full, root / "draft"), "other": noisy_copy(full, root / "other", noise=0.5, seed=7),
            "eagle3": make_eagle3_head(root / "eagle3", full, taps=[0, 0, 1])}


def gen(tmp_path, model, prompt, *args, cache=True, log=False):
    """One in-process `mtpcli generate` (T, seed and the rest in args): (stdout, its --stats-json)."""
    stats = tmp_path / "stats.json"
    jsonl = ["--prompts-jsonl", _jsonl(tmp_path, prompt)] if isinstance(prompt, list) else ["-p", prompt]
    r = CliRunner().invoke(app, ["generate", "-m", str(model), *jsonl, "--max-tokens", "24", "-q",
                                 *["--no-log"] * (not log), "--no-chat", "--prefill-step", str(STEP),
                                 "--stats-json", str(stats),
                                 "--prefill-cache" if cache else "--no-prefill-cache", *map(str, args)],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.stderr
    return r.stdout, json.loads(stats.read_text())


def _jsonl(tmp_path, prompts):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    return path


def cold_then_warm(tmp_path, model, prompt, *args, first=P1):
    """The cold run of `prompt` (the cache off), then `first` (kept), then `prompt` again (warm)."""
    cold, _ = gen(tmp_path, model, prompt, *args, cache=False)
    gen(tmp_path, model, first, *args)
    warm, stats = gen(tmp_path, model, prompt, *args)
    return cold, warm, stats


def _bits(lm: LM, hidden) -> list[bytes]:
    """Every array of a one-row LM's state (the keys' whole buffers, recurrent states, hidden states), as bytes."""
    arrays = [a for c in lm.caches for a in (c.state if hasattr(c, "layout") else c.cache)] + [hidden]
    return [(a.shape, a.dtype, np.array(a).tobytes()) for a in arrays if a is not None]


def _prefill(loaded, tokens, shelf, taps=()):
    """A one-row LM of `loaded` with `shelf`, after the prefill of `tokens`; and the hidden states it returned."""
    lm = LM(loaded.model, prefill_step=STEP, taps=taps, shelf=shelf)
    lm.add_rows(1)
    return lm, lm.set_row(0, tokens)


@pytest.mark.parametrize("kind", ["full", "window", "hybrid"])
def test_a_resumed_prefill_is_the_cold_one_bit_for_bit(models, tmp_path, kind):
    """The state after P2's prefill resumed from P1's kept state equals a cold prefill's, array for array, bit for
    bit, buffers' shapes included (and the tapped hidden states a head reads)."""
    loaded = loading.load(str(models[kind]))
    ids = [list(loaded.tokenizer.encode(p))[:-1] for p in (P1, P2)]
    store, taps = prefix.Store(64, tmp_path), (0, 1) if kind == "full" else ()
    _prefill(loaded, ids[0], store.shelf("key"), taps)
    store.flush()
    warm = _prefill(loaded, ids[1], store.shelf("key"), taps)
    assert warm[0].cached == KEPT
    assert _bits(*warm) == _bits(*_prefill(loaded, ids[1], None, taps))


def test_a_kept_state_of_other_shapes_under_the_same_key_is_a_miss_with_one_warning(models, tmp_path, capsys):
    """Shapes and dtypes are checked against the model's own (here a full-attention state offered to a hybrid)."""
    full, hybrid = loading.load(str(models["full"])), loading.load(str(models["hybrid"]))
    ids = list(full.tokenizer.encode(P1))[:-1]
    store = prefix.Store(64, tmp_path)
    _prefill(full, ids, store.shelf("key"))
    store.flush()
    capsys.readouterr()
    warm = _prefill(hybrid, ids, store.shelf("key"))
    assert warm[0].cached == 0 and _bits(*warm) == _bits(*_prefill(hybrid, ids, None))
    assert capsys.readouterr().err.count("shapes or dtypes") == 1


TEMPS = [("--temp", "0"), ("--temp", "1", "--seed", "5")]


@pytest.mark.parametrize("temp", TEMPS, ids=["T0", "T1"])
@pytest.mark.parametrize("kind", ["full", "window", "hybrid"])
@pytest.mark.parametrize("shape", ["one row", "ragged batch", "-n"])
def test_a_warm_run_gives_the_cold_runs_tokens(models, tmp_path, kind, shape, temp):
    """Every cache kind resumes where P1 was kept (recurrent layers: at that very boundary) and gives the cold run's
    text: one row, a batch of ragged rows each looked up (P2 warm, another turn of P1 warm, a short row cold), -n."""
    prompt = [P2, P1 + "and 7?", "ab"] if shape == "ragged batch" else P2
    extra = ("-n", "3") if shape == "-n" else ("--format", "jsonl") if shape == "ragged batch" else ()
    cold, warm, stats = cold_then_warm(tmp_path, models[kind], prompt, *temp, *extra)
    if shape == "ragged batch":  # (each row's line has its own timings)
        cold, warm = ([json.loads(line)["text"] for line in out.splitlines()] for out in (cold, warm))
    assert warm == cold and cold[0].strip()
    assert stats["prompt_cached_tokens"] == KEPT * (2 if shape == "ragged batch" else 1)


@pytest.mark.parametrize("temp", TEMPS, ids=["T0", "T1"])
@pytest.mark.parametrize("drafter", ["draft model", "history", "eagle3"])
def test_a_warm_run_gives_the_cold_runs_tokens_with_every_drafter(models, tmp_path, monkeypatch, drafter, temp):
    """A draft model resumes from its own kept prefill, an EAGLE-3 head from the target's kept hidden states, the
    history drafts from the same store (each run of a pair sees the same earlier outputs)."""
    args = {"draft model": ("--draft", "model", "--draft-model", models["draft"]), "history": ("--draft", "history"),
            "eagle3": ("--draft", "eagle3", "--draft-model", models["eagle3"])}[drafter]
    data = tmp_path / "data"
    data.mkdir()
    monkeypatch.setenv("XDG_DATA_HOME", str(data))
    gen(tmp_path, models["full"], P1, *temp, *args)  # kept (and, with the history, P1's output stored)
    shutil.copytree(data, tmp_path / "data-cold")
    warm, stats = gen(tmp_path, models["full"], P2, *temp, *args)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data-cold"))
    cold, _ = gen(tmp_path, models["full"], P2, *temp, *args, cache=False)
    assert warm == cold and cold.strip()
    assert stats["prompt_cached_tokens"] == KEPT
    assert stats["draft_cached_tokens"] == (KEPT if drafter == "draft model" else 0)


def test_the_statistics_and_the_run_log_say_how_many_prompt_tokens_each_model_reused(models, tmp_path):
    args = ("--draft", "model", "--draft-model", models["draft"])
    gen(tmp_path, models["full"], P1, *args, log=True)
    gen(tmp_path, models["full"], P2, *args, log=True)
    shown = CliRunner().invoke(app, ["stats"])
    assert f"prompt_cached_tokens: {KEPT} (draft model {KEPT})" in shown.stdout + shown.stderr
    logged = json.loads(CliRunner().invoke(app, ["stats", "--last", "2", "--json"]).stdout)
    assert sorted(r["stats"]["prompt_cached_tokens"] for r in logged) == [0, KEPT]
    assert sorted(r["stats"]["draft_cached_tokens"] for r in logged) == [0, KEPT]


def test_a_prompt_that_leaves_a_kept_one_resumes_at_their_last_shared_boundary(models, tmp_path):
    """An attention state serves a shorter shared prefix (its first n positions are the state at n); a recurrent
    state only its own boundary."""
    other = BASE + "something else entirely"
    for kind, expected in (("full", len(BASE) // STEP * STEP), ("hybrid", 0)):
        cold, warm, stats = cold_then_warm(tmp_path, models[kind], other)
        assert warm == cold and stats["prompt_cached_tokens"] == expected, kind


# ---- negative controls: each part of the key, and the prefix ------------------------------------------------------

def _copy(src, dst):
    shutil.copytree(src, dst)  # (file times kept: only what the test changes differs)
    return dst


@pytest.mark.parametrize("change", ["folder", "weights", "tokenizer", "prefix"])
def test_a_kept_state_of_another_model_tokenizer_or_prefix_is_never_used(models, tmp_path, change):
    """P1 kept for one model; P2 on a model that differs in one part of the key only is a miss, with the cold run's
    text. (Each case fails when its part is left out of the key.)"""
    model = _copy(models["full"], tmp_path / "m")
    gen(tmp_path, model, P1)
    prompt = P2
    if change == "folder":  # the same files in another folder
        model = _copy(model, tmp_path / "m2")
    elif change == "weights":  # the weights re-made in place: same folder, config and size
        shutil.copyfile(models["other"] / "model.safetensors", model / "model.safetensors")
        os.utime(model / "model.safetensors", ns=(1, 1))
    elif change == "tokenizer":  # a tokenizer file that differs (ids alike: only the key tells)
        cfg = json.loads((model / "tokenizer_config.json").read_text())
        (model / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": "{{ messages }}"}))
    else:  # another prompt from the second token on
        prompt = P2[0] + "x" + P2[2:]
    cold, _ = gen(tmp_path, model, prompt, cache=False)
    warm, stats = gen(tmp_path, model, prompt)
    assert stats["prompt_cached_tokens"] == 0 and warm == cold


# ---- faults: a subprocess each, as a user runs it --------------------------------------------------------------------

def run(model, prompt, cache_home, *args, env=None):
    return subprocess.run([sys.executable, "-m", "mtpcli", "generate", "-m", str(model), "-p", prompt, "--max-tokens",
                           "12", "-q", "--no-log", "--prefill-step", str(STEP), *map(str, args)], capture_output=True,
                          env={**os.environ, "XDG_CACHE_HOME": str(cache_home), **(env or {})}, timeout=300)


def clean(r, cold, warnings=0):
    """Exit 0, the cold text, no traceback, `warnings` warning lines."""
    err = r.stderr.decode()
    assert r.returncode == 0 and r.stdout == cold, err
    assert "Traceback" not in err and "internal error" not in err, err
    assert len([line for line in err.splitlines() if "warning" in line]) == warnings, err
    return err


def kept_files(cache_home):
    return sorted((Path(cache_home) / "mtpcli" / "prefill").glob("*.safetensors"))


@pytest.fixture(scope="module")
def cold(models, tmp_path_factory):
    """The cold texts of P1 and P2 on the full-attention model."""
    home = tmp_path_factory.mktemp("cold")
    return {p: run(models["full"], p, home, "--no-prefill-cache").stdout for p in (P1, P2)}


@pytest.fixture(scope="module")
def kept(models, tmp_path_factory, cold):
    """A cache folder that holds P1's prefill on the full-attention model (tests copy it)."""
    home = tmp_path_factory.mktemp("kept")
    clean(run(models["full"], P1, home), cold[P1])
    return home


@pytest.mark.parametrize("damage", ["corrupt", "truncated", "foreign", "another key"])
def test_a_damaged_or_foreign_file_is_a_miss_with_one_warning_and_left_in_place(models, tmp_path, cold, kept, damage):
    home = shutil.copytree(kept, tmp_path / "cache")
    (path,) = kept_files(home)
    data = path.read_bytes()
    if damage == "corrupt":  # a byte of the data flipped
        data = data[:-100] + bytes([data[-100] ^ 0xFF]) + data[-99:]
    elif damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "foreign":  # another program's safetensors file under our name
        data = (models["full"] / "model.safetensors").read_bytes()
    else:  # a kept file of another model under this one's name
        assert run(models["other"], P1, tmp_path / "other").returncode == 0
        data = kept_files(tmp_path / "other")[0].read_bytes()
    path.write_bytes(data)
    err = clean(run(models["full"], P2, home), cold[P2], warnings=1)
    assert str(path) in err
    assert path.read_bytes() == data  # left in place, never trusted


def test_ten_concurrent_runs_share_one_cache(models, tmp_path, cold):
    """Ten processes at once over one cache folder, half P1 and half P2 (each may find, write or replace the other's
    files meanwhile): every one exits 0 with the cold text and no warning."""
    home = tmp_path / "cache"
    prompts = [P1, P2] * 5
    with ThreadPoolExecutor(10) as pool:
        results = list(pool.map(lambda p: run(models["full"], p, home), prompts))
    for p, r in zip(prompts, results):
        clean(r, cold[p])
    assert kept_files(home)


def test_eviction_under_the_cap_while_other_runs_read(models, tmp_path, cold, kept):
    """A cap that holds about one kept file: every run evicts what the others keep and read meanwhile."""
    home = shutil.copytree(kept, tmp_path / "cache")
    cap = kept_files(home)[0].stat().st_size * 1.5 / (1 << 20)
    prompts = [P2, P1, P2, P1]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda p: run(models["full"], p, home, "--prefill-cache-mb", cap), prompts))
    for p, r in zip(prompts, results):
        clean(r, cold[p])
    assert sum(f.stat().st_size for f in kept_files(home)) <= cap * (1 << 20)


@pytest.fixture
def tmpfs(tmp_path):
    """A small tmpfs: mounting needs root (skipped without it; as root, as CI runs, a failed mount fails)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True)
    assert mounted.returncode == 0, mounted.stderr
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)])


def test_a_full_disk_only_loses_the_saving(models, tmp_path, tmpfs, cold):
    subprocess.run(["dd", "if=/dev/zero", f"of={tmpfs / 'fill'}", "bs=4k"], capture_output=True)  # until it is full
    err = clean(run(models["full"], P1, tmpfs), cold[P1], warnings=1)
    assert "not kept" in err and not kept_files(tmpfs) and not list(tmpfs.rglob("*.tmp"))


def test_a_read_only_cache_folder_still_serves_and_only_loses_the_saving(models, tmp_path, tmpfs, cold, kept):
    shutil.copytree(kept, tmpfs, dirs_exist_ok=True)
    before = {p: p.read_bytes() for p in kept_files(tmpfs)}
    assert subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)]).returncode == 0
    r = run(models["full"], P2, tmpfs, "--stats-json", tmp_path / "s.json")
    err = clean(r, cold[P2], warnings=1)
    assert "not kept" in err and json.loads((tmp_path / "s.json").read_text())["prompt_cached_tokens"] == KEPT
    assert {p: p.read_bytes() for p in kept_files(tmpfs)} == before


# ---- the store itself ----------------------------------------------------------------------------------------------

def test_every_damage_of_a_kept_file_is_refused_as_such(models, tmp_path):
    """A byte changed anywhere (header, token ids, data) or the file cut anywhere: read_header and load either refuse
    it (Bad) or, for a change that leaves the header's meaning alone (its padding), give back the very same state."""
    gen(tmp_path, models["full"], P1)
    (path,) = kept_files(os.environ["XDG_CACHE_HOME"])
    good, (meta, arrays) = path.read_bytes(), prefix.load(path)
    rng = np.random.default_rng(0)
    tokens = good.index(b'"tokens"') + 11  # (the token ids in the header)
    for cut in [*rng.integers(0, len(good), 40), *rng.integers(0, 300, 20), *rng.integers(tokens, tokens + 200, 20)]:
        path.write_bytes(good[:cut] + bytes([good[cut] ^ (1 << int(rng.integers(8)))]) + good[cut + 1 :]
                         if rng.random() < 0.7 else good[:cut])
        try:
            m, a = prefix.load(path)
            prefix.read_header(path)
        except prefix.Bad:
            continue
        assert m == meta and all(np.array_equal(a[k], arrays[k]) for k in arrays), cut


def test_the_kept_file_is_plain_safetensors_and_the_commands_list_and_clear_it(models, tmp_path, cli):
    gen(tmp_path, models["full"], P1)
    (path,) = kept_files(os.environ["XDG_CACHE_HOME"])

    arrays, meta = mx.load(str(path), return_metadata=True)  # (any safetensors reader reads it)
    assert len(meta["tokens"].split(",")) == KEPT
    assert arrays["0.keys"].shape[2] == KEPT
    listed = cli("prefill", "list")
    assert listed.returncode == 0 and str(KEPT).encode() in listed.stdout and b"target" in listed.stdout
    cleared = cli("prefill", "clear", "--yes")
    assert cleared.returncode == 0 and b"1 files deleted" in cleared.stderr and not kept_files(
        os.environ["XDG_CACHE_HOME"])
    assert prefix.listing() == []


def test_a_deferred_draft_model_counts_as_prefilled_only_what_it_prefilled(models, tmp_path):
    """Under auto the draft model starts a row empty: what the kept prefills hold of its prompt is not counted as
    prefilled at the start (a cold review found it counted so, for a model that never prefilled), and where it joins
    later, the kept part counts as cached; T = 0 stays --draft none's text."""
    args = ("--draft-model", models["draft"], "--temp", "0")
    gen(tmp_path, models["full"], P1, "--draft", "model", *args)  # keeps the draft model's state of P1
    out, stats = gen(tmp_path, models["full"], P2, "--draft", "auto", *args)
    assert out == gen(tmp_path, models["full"], P2, "--draft", "none", "--temp", "0")[0]
    prefilled, cached = stats["draft_prefill_tokens"], stats["draft_cached_tokens"]
    assert (prefilled, cached) == (0, 0) or (cached == KEPT and prefilled <= len(P2) + 24 - KEPT), stats


def test_kept_prefills_are_readable_by_their_owner_only(models, tmp_path):
    """A prompt's kept states hold the prompt (its token ids, and keys and values made from it): 0600 files in a
    0700 folder, as the run log and the history store are."""
    import stat

    gen(tmp_path, models["full"], P1, "--draft", "none")
    files = list(prefix.folder().glob("*.safetensors"))
    assert files and all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    assert stat.S_IMODE(prefix.folder().stat().st_mode) == 0o700
