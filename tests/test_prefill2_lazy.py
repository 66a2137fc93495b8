"""A deferred draft model costs nothing until auto brings it in (issue 54): its weights are read only when it first
drafts (mlx-lm's lazy load), and a draft of the target's tokenizer files does not read them a second time."""

import json

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten
from typer.testing import CliRunner

from mtpcli import models
from mtpcli.cli import app
from test_e2e import PAYS, PROMPT, deferred_engine, plain
from test_auto import run
from tiny import make_model, noisy_copy


@pytest.fixture(scope="module")
def big_draft(tmp_path_factory):
    """A tiny target and a draft model of its vocabulary ~100x its size (auto never brings it in: dearer than the
    target), whose weights alone outweigh what the target's run holds."""
    root = tmp_path_factory.mktemp("lazy")
    return make_model(root / "target"), make_model(root / "draft", hidden=512, layers=4)


def gen(target, prompt, *args):
    r = CliRunner().invoke(app, ["generate", "-m", str(target), "-p", prompt, "--max-tokens", "8", "-q", "--no-log",
                                 "--no-chat", *map(str, args)], catch_exceptions=False)
    assert r.exit_code == 0, r.stderr
    return r.stdout


def test_a_draft_model_auto_never_brings_in_is_never_read(big_draft, tmp_path):
    """The default with --draft-model: the same text as --draft none, and the run's peak memory far below the draft
    model's weights (loaded eagerly, they were all in memory before the first token)."""
    target, draft = big_draft
    weights = sum(v.nbytes for _, v in tree_flatten(models.load(str(draft)).model.parameters()))
    mx.clear_cache()
    mx.reset_peak_memory()
    stats = tmp_path / "stats.json"
    out = gen(target, PROMPT, "--draft-model", draft, "--stats-json", stats)
    doc = json.loads(stats.read_text())
    assert "model" not in doc.get("sources", {}) and doc["draft_prefill_tokens"] == 0  # (it never drafted)
    assert doc["peak_memory_bytes"] < weights / 4, (doc["peak_memory_bytes"], weights)
    assert out == gen(target, PROMPT, "--draft", "none")


def test_a_lazily_loaded_draft_model_that_joins_is_read_then_and_decodes_as_plain(tiny_paths, tiny):
    """auto brings a lazily loaded draft model in (a long answer pays for its catch-up): plain decoding's tokens."""
    target = tiny[0]
    draft = models.load_draft(str(tiny_paths["draft"]), target, lazy=True)
    ids = list(target.tokenizer.encode(PROMPT))
    eng = deferred_engine((target, draft), PAYS)
    assert run(eng, ids, max_tokens=120) == plain(tiny, ids, 120)
    assert eng.stats.sources["model"].cycles > 3


def test_a_draft_of_the_same_tokenizer_files_shares_the_targets_tokenizer(tiny_paths, tmp_path):
    """The same files, or another chat template (a draft's is never used): the target's tokenizer, not read again;
    another tokenizer setting: its own, read and checked."""
    target = models.load(str(tiny_paths["target"]))
    assert models.load_draft(str(tiny_paths["draft"]), target).tokenizer is target.tokenizer
    other = noisy_copy(tiny_paths["target"], tmp_path / "other")
    config = tmp_path / "other" / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "chat_template": "{{ messages }}"}))
    assert models.load_draft(str(other), target).tokenizer is target.tokenizer
    config.write_text(json.dumps({**json.loads(config.read_text()), "model_max_length": 77}))
    draft = models.load_draft(str(other), target)
    assert draft.tokenizer is not target.tokenizer and draft.tokenizer.model_max_length == 77
