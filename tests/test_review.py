"""Review of the tidy4 / trees / prefill2 / chat2 merges: what a cold read found."""

import json
from pathlib import Path

from mtpcli import config, models, prefix


def test_the_run_logs_settings_keep_the_system_message_only_with_log_prompts():
    """The command line keeps --system as <redacted> unless --log-prompts (README); the settings it records must not
    hold the text either (Config.record keeps every key since 9563c0a)."""
    cfg = config.Config(system="MY PRIVATE SYSTEM PROMPT")
    assert "MY PRIVATE SYSTEM PROMPT" not in json.dumps(cfg.record())
    assert cfg.record(texts=True)["system"] == "MY PRIVATE SYSTEM PROMPT"
    assert config.Config().record()["system"] is None


def _tiktoken_folder(path: Path, vocab: str) -> Path:
    path.mkdir()
    (path / "tokenizer_config.json").write_text('{"tokenizer_class": "TikTokenTokenizer"}')
    (path / "tiktoken.model").write_text(vocab)
    return path


def test_a_draft_whose_tiktoken_vocabulary_differs_does_not_share_the_targets_tokenizer(tmp_path):
    """models.TOKENIZER_FILES names tiktoken.model, which prefix.TOKENIZER_FILES (what _vocabulary compares) missed:
    two different vocabularies compared equal, the draft took the target's tokenizer and check_pair saw one."""
    a, b = _tiktoken_folder(tmp_path / "a", "aGVsbG8= 0\n"), _tiktoken_folder(tmp_path / "b", "d29ybGQ= 0\n")
    assert all(any(p.name == n for p in prefix.tokenizer_files(a)) for n in models.TOKENIZER_FILES
               if (a / n).is_file())
    assert models._vocabulary(a) != models._vocabulary(b)
    c = _tiktoken_folder(tmp_path / "c", "aGVsbG8= 0\n")
    assert models._vocabulary(a) == models._vocabulary(c)


def test_a_state_this_run_keeps_serves_its_later_prefills_before_it_is_written(tmp_path):
    """generate -c: after the answer, assemble.warm prefills the conversation to its last boundary from the shelf;
    the prompt's state this run kept is still pending (written at flush), and a shelf that looks only at files
    prefilled the whole prompt again (from the previous turn's file, or from 0)."""
    import mlx.core as mx

    store = prefix.Store(64, tmp_path)
    shelf = store.shelf("k")
    tokens = list(range(256))
    state = {"0.keys": mx.arange(256 * 4, dtype=mx.float32).reshape(1, 1, 256, 4)}
    shelf.keep(tokens, state, True)
    assert [c[0] for c in shelf.candidates(tokens + [7] * 200, 128, True)] == [256]
    n, arrays = shelf.find(tokens + [7] * 200, 128, True, lambda n, a: True)
    assert n == 256 and arrays is state
    assert shelf.candidates([5] + tokens, 128, True) == []  # (another prefix: nothing)
