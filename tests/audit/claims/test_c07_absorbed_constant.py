"""C7 on synthetic per-seed evidence: the identity decides what can be absorbed, plain dot at
its own tuned LR whether the LR alone does; flips, no-effect and scipy checks; no sentence
reads as another verdict."""

from __future__ import annotations

import pytest
from support import (
    NULL_DRAWS,
    Draw,
    assert_print_quality,
    assert_reads_as,
    assert_scipy,
    best_p,
    head_dim,
    holm_by_hand,
    layouts,
    vals,
)

from attnscale.audit import verdicts as V
from attnscale.audit.claims import c07_absorbed_constant as M
from attnscale.audit.readings import cell
from attnscale.audit.verdicts import LOSS_DELTA


def test_c7_flips_between_absorbed_by_the_lr_and_not():
    ok = M.CLAIM.decide(head_dim(Draw(0), 0.0))
    assert ok.verdict == "supported"
    dep = M.CLAIM.decide(head_dim(Draw(0), 0.2))
    assert dep.verdict == "depends"
    # the sentences carry the numbers, so they change with the evidence
    assert ok.plain != dep.plain and ok.headline != dep.headline
    assert f"{dep.numbers['dot']['256'].mean:+.3f}" in dep.headline
    assert dep.plain[0].startswith("Partly right") and ok.plain[0].startswith("Right")
    assert "identity held to 3e-10 nats over 20 float64 steps" in dep.plain[1]
    assert "differ by 0.15 nats" in dep.plain[1]
    # the identity is the evidence on absorbing the constant; no trained absorbed arm is read
    assert dep.plain[3].startswith("With gpt2 init plain dot is") and len(dep.plain) == 4


def test_c7_says_the_scale_is_a_per_layer_lr_with_its_factor_at_every_d_k():
    """The identity read the other way: dropping 1/√d_k is the scaled model with W_q's and
    W_k's init and Adam LR × d_k^(1/4), √d_k on the logits, printed at the study's d_k."""
    v = M.CLAIM.decide(head_dim(Draw(0), 0.2))
    lr = v.plain[2]
    assert lr.startswith("So the scale is a per-layer learning rate and init for W_q and W_k")
    assert "× 2, 2.83, 3.36, 4 at d_k = 16, 64, 128, 256 (√d_k = 4, 8, 11.3, 16 on the " \
        "logits)" in lr
    small = M.CLAIM.decide(head_dim(Draw(0), 0.2, dks=(16, 64))).plain[2]
    assert "× 2, 2.83 at d_k = 16, 64 (√d_k = 4, 8 on the logits)" in small
    entry = {"numbers": {"identity": [r.model_dump() for r in v.numbers["identity"]]}}
    (said,) = M.says_scale(entry)
    assert said.startswith("The scale is a per-layer learning rate and init for W_q and W_k")
    assert "× 2, 2.83, 3.36, 4 at d_k = 16, 64, 128, 256" in said
    assert "alike to 3e-10 nats (C7)" in said and "effective LR and init" in said
    assert M.says_scale({"numbers": {"identity": []}}) == []


def test_c7_reads_no_trained_absorbed_arm():
    """The head-dimension study trains scaled_dot and dot only; a dot_absorbed arm left in the
    evidence (an older report, or one trained by hand) changes nothing C7 says."""
    ev = head_dim(Draw(0), 0.2)
    v = M.CLAIM.decide(ev)
    assert set(v.numbers) == {"dot", "identity", "partial"}
    assert "trained" not in v.because and "absorbed" not in v.because
    for row in ev["loss"].values():
        row["dot_absorbed"] = Draw(9).arm(2.5, 0.002)
    w = M.CLAIM.decide(ev)
    assert (w.verdict, w.plain, w.because, set(w.numbers)) == (v.verdict, v.plain, v.because,
                                                                set(v.numbers))


def test_c7_a_broken_identity_is_a_bug_and_a_missing_one_is_named():
    ev = head_dim(Draw(0), 0.0)
    ev["identity"]["exact"][1]["max_loss_diff"] = 0.01
    with pytest.raises(ValueError, match="identity broke at d_k=64"):
        M.CLAIM.decide(ev)
    ev["identity"] = {}
    with pytest.raises(V.MissingEvidence, match="identity"):
        M.CLAIM.decide(ev)


def test_c7_the_identity_holds_in_the_lab():
    """The reparametrization of lab.build is exact: in float64 the absorbed arm trains like
    scaled_dot to rounding, clipping active; without the ε and clip corrections it drifts."""
    from attnscale.lab.identity import absorbed_identity
    cfg = {"task": "text", "seq_len": 16, "batch_size": 8, "n_layers": 1, "mlp": False,
           "n_heads": 1, "d_model": 64, "init": "unit", "lr": 1e-2, "seed": 3, "steps": 12,
           "warmup_steps": 1, "grad_clip": 0.3}
    exact = absorbed_identity(cfg, steps=12)
    assert exact["clipped_steps"] >= 3 and exact["max_loss_diff"] < M.IDENTITY_TOL
    assert exact["max_weight_rel_diff"] < 1e-9
    drift = absorbed_identity(cfg, steps=12, partial=True)
    assert drift["max_loss_diff"] > 100 * M.IDENTITY_TOL


def test_c7_dot_better_than_scaled_still_supports():
    assert M.CLAIM.decide(head_dim(Draw(1), -0.2)).verdict == "supported"


def test_c7_no_effect_is_mostly_undecided_and_never_a_gap():
    """No effect, coarse (noise 5δ): never depends (a false gap), undecided in most draws, the
    rest supported (plain dot truly is no worse)."""
    coarse = [M.CLAIM.decide(head_dim(Draw(r), 0.0, noise=5 * LOSS_DELTA)).verdict
              for r in NULL_DRAWS]
    assert set(coarse) <= {"inconclusive", "supported"}
    assert coarse.count("inconclusive") >= 0.75 * len(coarse), coarse


def test_c7_censored_or_few_seeds_is_inconclusive():
    ev = head_dim(Draw(2), 0.0)
    ev["loss"][cell("unit", 256)]["dot"]["censored"] = True
    v = M.CLAIM.decide(ev)
    assert v.verdict == "inconclusive" and "censored" in v.numbers["dot"]["256"].why
    assert M.CLAIM.decide(head_dim(Draw(2, n=2), 0.0)).verdict == "inconclusive"
    assert M.CLAIM.decide(head_dim(Draw(2, n=3), 0.0)).verdict == "supported"


def test_c7_statistics_are_scipys():
    dks = (64, 256)
    ev = head_dim(Draw(3), lambda d: 0.05 * d / 64, noise=0.01, dks=dks)
    v = M.CLAIM.decide(ev)
    rows = [ev["loss"][cell("unit", d)] for d in dks]
    assert [v.numbers["dot"][str(d)].reading for d in dks] == ["greater", "greater"]
    # Holm over the dot comparisons across d_k (the rule reads them through 'some')
    want = holm_by_hand([best_p(vals(r["dot"]), vals(r["scaled_dot"])) for r in rows])
    assert want[0] != want[1]
    for d, r, p in zip(dks, rows, want, strict=True):
        assert_scipy(v.numbers["dot"][str(d)], r["dot"], r["scaled_dot"], LOSS_DELTA, p_holm=p)


def test_c7_evidence_missing_a_field_is_named():
    ev = head_dim(Draw(0), 0.0)
    del ev["head_dims"]
    with pytest.raises(V.MissingEvidence, match="head_dims"):
        M.CLAIM.decide(ev)


def test_c7_draws_its_figure(tmp_path, monkeypatch):
    saved = layouts(monkeypatch)
    ev = M.Evidence.model_validate(head_dim(Draw(0), 0.2))
    v = M.judge(ev)
    from attnscale.util.jsonio import jsonable
    figs = M.draw(ev.model_dump(), jsonable(v.numbers), tmp_path)
    assert [f["path"].endswith("c7_head_dim.png") for f in figs] == [True]
    assert "Without 1/√d_k the eval loss moves by" in figs[0]["alt"]
    assert "with GPT-2 init the gap is" in figs[0]["alt"] and "rescaling q, k" not in figs[0]["alt"]
    assert_print_quality(figs[0])
    assert [problems for _, problems in saved] == [[]]


# ------------------------------------------------------------------------------ sentences

CASES = {
    V.SUPPORTED: lambda: M.CLAIM.decide(head_dim(Draw(0), 0.0)),
    V.DEPENDS: lambda: M.CLAIM.decide(head_dim(Draw(0), 0.2)),
    V.INCONCLUSIVE: lambda: M.CLAIM.decide(head_dim(Draw(0, n=2), 0.0)),
}


@pytest.mark.parametrize("verdict", list(CASES))
def test_no_sentence_reads_as_another_verdict(verdict):
    assert_reads_as(CASES[verdict](), verdict, "C7")


def test_every_verdict_is_covered():
    """C7 cannot be refuted: that would need the exact identity to fail, which raises."""
    assert set(CASES) == set(V.VERDICTS) - {V.REFUTED}
