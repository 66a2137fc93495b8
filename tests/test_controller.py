"""Draft width policies as pure objects."""

import pytest

from mtpcli.controller import EmaController, FixedWidth

import helpers


def test_update_rule_on_scripted_accepts():
    c = EmaController(n_min=1, n_max=8)
    assert c.estimate() == 2.0 and c.width() == 2
    c.update([2], [1])  # partial: 0.75 * 2 + 0.25 * 1
    assert c.estimate() == pytest.approx(1.75)
    c.update([2], [2])  # full accept, censored: probe up by 1
    assert c.estimate() == pytest.approx(2.75)
    assert c.width() == 3


def test_full_accepts_climb_to_n_max_and_never_exceed_it():
    c = EmaController(n_min=1, n_max=5)
    for _ in range(10):
        c.update([c.width()], [c.width()])
    assert c.estimate() == 5.0 and c.width() == 5


def test_decaying_acceptance_backs_off():
    c = EmaController(n_min=1, n_max=8, init=6.0)
    widths = []
    for _ in range(12):
        w = c.width()
        widths.append(w)
        c.update([w], [0])
    assert widths[0] == 6 and widths[-1] == 1
    assert widths == sorted(widths, reverse=True)


def test_clamp_bounds():
    c = EmaController(n_min=3, n_max=4, init=1.0)
    assert c.width() == 3
    c.rows[0] = 100.0
    assert c.width() == 4


@pytest.mark.parametrize("kw", [dict(n_min=0, n_max=3), dict(n_min=5, n_max=3), dict(alpha=0.0)])
def test_invalid_bounds_are_refused(kw):
    with pytest.raises(ValueError):
        EmaController(**kw)


def test_bug1_floor_cut_then_fully_accepted_is_censored_not_partial():
    # Requested 4, the confidence floor cut the draft to 2 tokens, and both were accepted: a full accept of what
    # was drafted says only "acceptance >= 2" (censored), so it probes up instead of averaging 2 in.
    c = EmaController(n_min=1, n_max=8, init=3.0)
    c.update([2], [2])  # fed the realized length
    assert c.estimate() == 4.0  # censored: probe up


def test_bug2_batch_shares_one_width_and_keeps_separate_estimates():
    c = EmaController(n_min=1, n_max=8, batch=2)
    for _ in range(4):
        w = c.width()
        c.update([w, w], [w, 0])  # member 0 accepts everything, member 1 nothing
    assert c.rows[0] > c.rows[1]
    assert c.member_width(0) != c.member_width(1)
    assert c.width() == max(c.member_width(0), c.member_width(1))
    c.reset(1)
    assert c.rows[1] == 2.0 and c.rows[0] > 2.0


def test_fixed_width_drafts_its_width_whatever_was_accepted():
    f = FixedWidth(4, batch=2)
    f.update([4, 4], [1, 4])
    assert f.width() == 4 and helpers.source_width(f.plan()) == (None, 4)
