"""Issue 58: `mtpcli bench` times mlx-lm's speculative decoding as it times mtpcli's. mlx-lm's prompt time runs to its
first token, which its speculative decoding yields after the first whole cycle (a draft and its verification): that
cycle is decode time, or a short answer's decode speed counts up to width + 1 tokens for free."""

import time
from types import SimpleNamespace

import pytest

from mtpcli import bench, config

PREFILL, CYCLE = 0.2, 0.1


def fake_stream(model, tokenizer, prompt, max_tokens, sampler, last=False, **kw):
    """As mlx-lm's speculative decoding yields: after the prompt AND the first cycle, that cycle's tokens (two drafted,
    one of the target's), then each later cycle's; prompt_tps from the time to the first token. `last`: 2 cycles, the
    second all drafted (an answer whose last cycle ends in its drafted end token)."""
    t0 = time.perf_counter()
    time.sleep(PREFILL)
    for c in range(4 - 2 * last):
        time.sleep(CYCLE)
        for j in range(3):
            tps = prompt.size / (time.perf_counter() - t0)
            yield SimpleNamespace(token=3 * c + j, from_draft=j < 2 or last and c == 1, prompt_tokens=prompt.size,
                                  prompt_tps=tps, finish_reason="stop" if c == 3 - 2 * last and j == 2 else None)


def test_mlx_lms_first_speculative_cycle_is_decode_time_not_prompt_time(monkeypatch):
    monkeypatch.setattr(bench, "stream_generate", fake_stream)
    cfg = config.Config(draft_model="d", num_draft_tokens=2)
    draft = SimpleNamespace(model=None)
    st, tokens = bench.run_mlx_lm(cfg, SimpleNamespace(model=None, tokenizer=None), draft, [1, 2, 3], 0, 12)
    assert len(tokens) == 12 and st.cycles == 4
    assert st.prefill_s == pytest.approx(PREFILL, abs=0.04)  # was PREFILL + CYCLE
    assert st.decode_s == pytest.approx(4 * CYCLE, abs=0.04)  # was 3 cycles for 4 cycles' tokens


def test_a_two_cycle_answer_that_ends_in_drafted_tokens_has_its_first_cycle_counted_too(monkeypatch):
    monkeypatch.setattr(bench, "stream_generate", lambda *a, **k: fake_stream(*a, last=True, **k))
    cfg = config.Config(draft_model="d", num_draft_tokens=2)
    st, tokens = bench.run_mlx_lm(cfg, SimpleNamespace(model=None, tokenizer=None), SimpleNamespace(model=None),
                                  [1, 2, 3], 0, 12)
    assert len(tokens) == 6
    assert st.decode_s == pytest.approx(2 * CYCLE, abs=0.04)  # was 1 cycle: no cycle ended in a target token
