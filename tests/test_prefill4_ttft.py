"""What a warm run pays before its first token, and what a deferred draft model costs (issue 54, docs/perf/prefill.md):
the first token is read before the next step is launched (on a CPU a launch computes its pass), a kept file is read
by MLX straight into its arrays (no copy of the file in memory on the way), and a draft that shares the target's
tokenizer is paired without building its vocabulary."""

import os
from pathlib import Path

import mlx.core as mx
import pytest

from mtpcli import models, prefix
from mtpcli.engine import DecodeConfig, Engine
from helpers import copies, gather


@pytest.mark.parametrize("rows", [1, 3])
def test_the_first_token_is_out_before_the_next_step_is_launched(tiny, rows):
    """Plain decoding chains its steps (each launched while the one before is in flight), but not the first: a row's
    first token is written before the second step is launched, then the steps chain; the tokens are the same."""
    target = tiny[0]
    ids = list(target.tokenizer.encode("the sea is "))
    seen = []
    eng = Engine(target.model, None, None, (), DecodeConfig(), batch_size=rows)
    launch = eng._launch
    eng._launch = lambda plan, after=None, fresh=False: seen.append("launch" if after is None else "chained") or \
        launch(plan, after, fresh)
    events = []
    for ev in eng.generate(copies(ids, rows, 6, 0)):
        seen.append("token")
        events.append(ev)
    first = ["launch"] + ["token"] * rows + ["launch"]  # (was: launch, chained, then the first tokens)
    assert seen[: len(first)] == first and "chained" in seen[len(first):]
    plain = Engine(target.model, None, None, (), DecodeConfig(), batch_size=1)
    assert gather(events, rows) == gather(plain.generate(copies(ids, rows, 6, 0)), rows)


def test_a_kept_file_is_read_straight_into_its_arrays(tmp_path, monkeypatch):
    """prefix.load reads the header, then lets MLX read the data into the arrays: the file is never read whole into
    a bytes object first; the arrays and their checksum are still checked."""
    path = tmp_path / "k.safetensors"
    arrays = {"0.keys": mx.random.normal((1, 2, 64, 8)), "0.values": mx.random.normal((1, 2, 64, 8))}
    prefix.save(path, "key", list(range(64)), arrays)
    monkeypatch.setattr(Path, "read_bytes", lambda self: pytest.fail(f"{self} read whole"))
    meta, got = prefix.load(path)
    assert meta["key"] == "key" and all(mx.array_equal(got[k], arrays[k]).item() for k in arrays)
    data = bytearray(open(path, "rb").read())
    data[-5] ^= 0x10  # a bit of the data flipped: its checksum refuses it
    path.write_bytes(bytes(data))
    with pytest.raises(prefix.Bad, match="checksum"):
        prefix.load(path)


def test_a_draft_sharing_the_targets_tokenizer_is_paired_without_building_its_vocabulary(tiny_paths, tiny,
                                                                                        monkeypatch):
    """The draft of the target's tokenizer files takes the target's tokenizer: the same vocabulary, by construction,
    so check_pair does not build it (151k tokens: 0.16 s of every run with --draft-model on Qwen2.5)."""
    target = tiny[0]
    monkeypatch.setattr(type(target.tokenizer._tokenizer), "get_vocab",
                        lambda self: pytest.fail("the vocabulary was built"), raising=False)
    draft = models.load_draft(str(tiny_paths["draft"]), target, lazy=True)
    assert draft.tokenizer is target.tokenizer


def test_a_kept_file_evicted_while_it_is_read_is_a_silent_miss(tmp_path, monkeypatch):
    # another run evicts the file between its header's read and MLX's: FileNotFoundError (Shelf.find skips it
    # silently), not Bad (a "damaged" warning about a file that was fine)
    path = tmp_path / "k.safetensors"
    prefix.save(path, "key", list(range(64)), {"0.keys": mx.zeros((1, 2, 64, 8))})
    real = prefix.read_header
    monkeypatch.setattr(prefix, "read_header", lambda p: (real(p), os.unlink(p))[0])
    with pytest.raises(FileNotFoundError):
        prefix.load(path)
