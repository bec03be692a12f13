"""The page's glossary says what the code computes: each definition is checked against the
function that computes the quantity."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

from attnscale.measure.stats import attention_stats

TEMPLATE = (Path(__file__).parents[2] / "src/attnscale/audit/templates/report.html").read_text()


def glossary(term: str) -> str:
    """The definition of ``term`` in the page's glossary (tags stripped)."""
    m = re.search(rf"<dt>{re.escape(term)}</dt><dd>(.*?)</dd>", TEMPLATE, re.S)
    assert m, term
    return re.sub(r"<[^>]+>", "", m.group(1))


def test_effective_keys_is_the_participation_ratio_the_code_computes():
    text = glossary("Effective keys")
    assert "1/Σp²" in text and "exp(entropy)" not in text
    logits = torch.tensor([2.0, 0.0, -1.0, 0.5], dtype=torch.float64)
    query = torch.ones(1, 1, 1, 1, dtype=torch.float64)  # (B, H, T, d = 1): q·k_j = k_j
    key = logits.view(1, 1, 4, 1)  # (B, H, n, 1)
    st = attention_stats(query, key, score="dot")
    p = logits.softmax(-1)
    participation = float(1 / (p**2).sum())
    assert float(st.effective_keys[0]) == pytest.approx(participation, rel=1e-6)
    entropy = float(-(p * p.log()).sum())
    assert abs(math.exp(entropy) - participation) > 0.1  # the two definitions differ here


def test_the_freezing_scale_values_are_sqrt_2_ln_n():
    text = glossary("s_c = √(2 ln n)")
    for value, n in re.findall(r"(\d+\.\d) at n = (\d+)", text):
        assert float(value) == round(math.sqrt(2 * math.log(int(n))), 1), (value, n)


def test_lr_sensitivity_names_no_fixed_grid_span():
    assert "factor-of-10" not in glossary("LR sensitivity")
