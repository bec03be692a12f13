"""The deep preset's readings: the instability study's pairs exist only where some run was
unstable, and its sentence says what it saw (or that it was not run). C11's reading of it is
tested with C11."""

from __future__ import annotations

from attnscale.audit.deep_readings import Unstable, observed, unstable_pairs, unstable_sentence


def arm(shares, n_unstable, peak=50.0):
    return {"unstable": {str(i): x for i, x in enumerate(shares)}, "n_runs": 3 * len(shares),
            "n_unstable": n_unstable, "peak_logit": peak}


def study(dot=(0.0, 0.0, 0.0), dot_n=0):
    row = {"scaled_dot": arm((0.0, 0.0, 0.0), 0), "dot": arm(dot, dot_n),
           "scaled_dot_noclip": arm((0.0, 0.0, 0.0), 0), "dot_noclip": arm(dot, dot_n)}
    quiet = {k: arm((0.0, 0.0, 0.0), 0) for k in row}
    return Unstable.model_validate({"cells": {"d_model=64": quiet, "d_model=256": row},
                                    "steps": 1000, "lrs": [0.03, 0.1, 0.3]})


def test_nothing_unstable_is_no_comparison_and_says_so():
    ev = study()
    assert observed(ev) == 0 and unstable_pairs(ev) == {}
    line = unstable_sentence(ev)
    assert "none of 72 was unstable: not observed at this scale either" in line
    assert "1000 steps, widths 64, 256, LRs 0.03, 0.1, 0.3" in line
    assert "was not run here" in unstable_sentence(None)


def test_instability_where_observed_becomes_paired_comparisons():
    ev = study(dot=(1.0, 2 / 3, 1.0), dot_n=8)
    pairs = unstable_pairs(ev)
    assert set(pairs) == {"deep d_model=256 unstable: dot − scaled_dot",
                          "deep d_model=256 unstable: dot_noclip − scaled_dot_noclip"}
    assert "16 of 72 were unstable" in unstable_sentence(ev)
