"""C12 (1/√d_k keeps the logits O(1)) on synthetic logits: the rule flips with the init and
trained logits, checks every seed at every LR and width, reads inconclusive without data, and
its figure draws (or fails loudly without data)."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest
from support import CLAIMS_MD, WIDTHS, layouts, png_info

from attnscale.audit.claim import Sources
from attnscale.audit.claims import c12_logits_o1 as M
from attnscale.audit.evidence import head_dim_evidence, init_logit_std, lr_text_evidence
from attnscale.audit.verdicts import MissingEvidence

SEEDS5 = [str(i) for i in range(5)]


def c12(unit=1.0, gpt2=0.01, trained=(3.0, 5.0), n=32, outlier=None):
    """Init logit std per regime, d_k and seed; scaled_dot's final max |logit| per width, LR and
    seed (``outlier``: one seed's value at width 0, LR 0.3)."""
    def seeds(v):
        return {s: v * (1 + 0.01 * i) for i, s in enumerate(SEEDS5)}
    final = {w: {"0.001": seeds(2.0), "0.3": seeds(t)} for w, t in zip(WIDTHS, trained,
                                                                       strict=True)}
    if outlier is not None:
        final[WIDTHS[0]]["0.3"]["0"] = outlier
    return {"init_std": {"gpt2": {d: seeds(gpt2) for d in ("16", "64")},
                         "unit": {"16": seeds(unit), "64": seeds(unit * 1.05)}},
            "final_logit": final, "n": n}


def judge(ev):
    return M.CLAIM.decide(ev)


LIMIT = 4 * math.sqrt(2 * math.log(32))  # 4·s_c(n), s_c = √(2 ln n): 10.5 at n = 32


def test_c12_flips_with_the_init_and_trained_logits():
    ok = judge(c12())
    assert ok.verdict == "supported" and ok.numbers["limit"] == pytest.approx(LIMIT)
    bad = judge(c12(unit=8.0))
    assert bad.verdict == "refuted" and bad.headline == "refuted: not O(1) at init"
    assert judge(c12(unit=0.1)).verdict == "refuted"
    past = judge(c12(trained=(3.0, 50.0)))
    assert past.verdict == "depends" and past.numbers["past"] == [0.3]
    assert "0.3" in past.headline and ok.headline == "supported: O(1) at init and after training"
    assert ok.plain != bad.plain != past.plain
    assert "1–1.09" in ok.plain[0] and "O(1)" in ok.plain[0] and "not O(1)" in bad.plain[0]
    assert "largest final logit is 52" in past.plain[-1]


def test_c12_one_seed_past_the_limit_counts_and_a_blow_up_is_past():
    """Every seed is checked: one seed past 4·s_c, or one diverged (inf), is not averaged away."""
    assert judge(c12(outlier=40.0)).numbers["past"] == [0.3]
    blown = judge(c12(outlier=math.inf))
    assert blown.verdict == "depends" and blown.numbers["past"] == [0.3]


def test_c12_a_logit_past_the_limit_at_any_width_counts():
    """Every LR at every width: width 32 passing 4·s_c at LR 0.3 is not hidden by width 128
    staying below it at the same LR."""
    v = judge(c12(trained=(50.0, 3.0)))
    assert v.verdict == "depends" and v.numbers["past"] == [0.3]


def test_c12_without_data_is_inconclusive():
    ev = c12()
    ev["init_std"]["unit"] = {"16": {}, "64": {}}
    assert judge(ev).verdict == "inconclusive"
    ev = c12()
    ev["final_logit"] = {w: {} for w in WIDTHS}
    assert judge(ev).verdict == "inconclusive"
    assert judge({**c12(), "init_std": {}}).verdict == "inconclusive"
    assert judge({**c12(), "init_std": {}}).headline == "inconclusive: no data"


@pytest.mark.parametrize("n", [8, 32, 512])
def test_c12_limit_is_four_saturation_scales(n):
    """s_c = √(2 ln n): the logit std at which the largest of n unit-variance logits stands out
    (the Gaussian maximum's scale); just under and just over 4·s_c decide the verdict."""
    limit = 4 * math.sqrt(2 * math.log(n))
    assert M.limit_of(n) == pytest.approx(limit)
    assert judge(c12(trained=(3.0, limit * 0.95), n=n)).verdict == "supported"
    assert judge(c12(trained=(3.0, limit * 1.01), n=n)).verdict == "depends"


def test_c12_gpt2_init_is_described_not_judged():
    """The GPT-2 regime's small logits are a sentence, never a verdict: only unit-variance
    seeds decide the init half."""
    v = judge(c12(gpt2=0.01))
    assert v.verdict == "supported" and "far below 1, set by the init" in v.plain[1]
    assert "of order one" in judge(c12(gpt2=1.0)).plain[1]
    no_gpt2 = c12()
    del no_gpt2["init_std"]["gpt2"]
    assert len(judge(no_gpt2).plain) == 2


def test_c12_evidence_missing_a_field_is_missing_evidence():
    ev = c12()
    del ev["n"]
    with pytest.raises(MissingEvidence, match="n"):
        M.CLAIM.decide(ev)
    with pytest.raises(MissingEvidence, match="final_logit"):
        M.CLAIM.decide({k: v for k, v in c12().items() if k != "final_logit"})


def test_c12_claim_is_registered_with_its_studies():
    from attnscale.audit.claim import get_claim

    assert get_claim("C12") is M.CLAIM and not M.CLAIM.question
    assert M.CLAIM.studies == ("head_dim", "lr_text") and M.CLAIM.measurements == ()
    assert M.CLAIM.text == "Dividing by √d_k keeps logits O(1): no saturation, gradients flow."
    assert "C12" in CLAIMS_MD


def test_c12_gathers_init_std_and_final_logits_as_claim_evidence_did():
    """gather builds exactly the dict claim_evidence built: scaled_dot's step-0 logit std from
    the head-dimension study, its final max |logit| by width from the text study, and n."""
    seeds = {str(s): 1.0 + 0.1 * s for s in range(3)}
    dk = {"logit_std_init": {"init=unit d_model=16": {"scaled_dot": {"values": seeds},
                                                      "dot": {"values": {"0": 9.0}}},
                             "init=gpt2 d_model=16": {"dot": {"values": {"0": 0.1}}}}}
    final = {"0.01": {"0": 3.0, "1": math.inf}}
    text = {"sweep": {"d_model=32": {"scaled_dot": {"final_logit_by_lr": final}},
                      "d_model=128": {"dot": {"final_logit_by_lr": {"0.01": {"0": 1.0}}}}},
            "n": 64}
    src = Sources(preset=None, studies={}, runs={}, measured={},
                  memo={("head_dim", head_dim_evidence): dk, ("lr_text", lr_text_evidence): text})
    got = M.CLAIM.gather(src)
    assert got == {"init_std": init_logit_std(dk),
                   "final_logit": {"d_model=32": final, "d_model=128": {}}, "n": 64}
    assert got["init_std"] == {"unit": {"16": seeds}, "gpt2": {"16": {}}}
    assert M.CLAIM.read(got).final_logit["d_model=32"]["0.01"]["1"] == math.inf


# ------------------------------------------------------------------------------ figures


def figure_evidence() -> dict[str, Any]:
    """C12's evidence shaped like the report's: one diverged seed at width 128."""
    seeds, lrs = range(6), (1e-3, 1e-2, 1e-1)
    final = {w: {str(lr): {str(s): k * 1e3 * lr * (1 + 0.1 * s) for s in seeds} for lr in lrs}
             for k, w in ((1.0, WIDTHS[0]), (2.0, WIDTHS[1]))}
    final[WIDTHS[1]]["0.1"]["0"] = math.inf
    return {"init_std": {"unit": {"16": {str(s): 1.0 + 0.02 * s for s in seeds}},
                         "gpt2": {"16": {str(s): 0.01 for s in seeds}}},
            "final_logit": final, "n": 32}


def test_c12_draws_init_and_trained_logits_with_a_finding(tmp_path, monkeypatch):
    saved = layouts(monkeypatch)
    ev = figure_evidence()
    numbers = judge(ev).numbers
    figs = M.draw(ev, numbers, tmp_path)
    assert [Path(f["path"]).name for f in figs] == ["c12_trained_logits.png"]
    width, height, dpi = png_info(figs[0]["path"])
    assert dpi >= 150 and width >= 600 and height >= 400
    alt = figs[0]["alt"]
    assert alt.startswith("At init scaled_dot's logit std is 1–1.1 with unit init, 0.01–0.01 "
                          "with gpt2 init.")
    assert "largest final max |logit| is inf" in alt and "from LR 0.01" in alt
    assert re.search(r"4·s_c = 10\.5", alt) and alt.rstrip().endswith(".")
    assert [problems for _, problems in saved] == [[]]


def test_c12_alt_without_trained_logits_says_so():
    ev = {"init_std": {}, "final_logit": {}, "n": 32}
    assert M.alt(ev, {}) == "No scaled_dot logit was measured."
    assert M.alt({**figure_evidence(), "final_logit": {}}, {}).startswith("At init")


def test_c12_figure_with_missing_data_is_an_error_not_faked(tmp_path):
    ev = {"init_std": {"unit": {"8": {}}}, "final_logit": {}, "n": 32}
    with pytest.raises(ValueError, match="no scaled_dot logit"):
        M.draw(ev, {}, tmp_path)
    assert not list(tmp_path.iterdir())
