"""One ``register(Score(...))`` is all a new score needs: a toy score, registered for the length
of a test, shows up in the attention function, the modules, bench, theory and Monte Carlo,
``attnscale train``, a sweep and the figures, with no other edit."""

from __future__ import annotations

import json
import math

import pytest
import torch

from attnscale import attention, reference_attention
from attnscale.audit import explorer, theory_plots
from attnscale.core.learned import per_head_value
from attnscale.core.nn import MultiheadSelfAttention
from attnscale.core.scores import SCORES, Score, dot_logits, per_head, registered
from attnscale.measure import bench
from attnscale.measure import montecarlo as mc
from attnscale.measure import theory as th


def _toy_prepare(q, k, scale, p, ctx):
    a = per_head(p["a"])
    a = a.to(q.dtype) if isinstance(a, torch.Tensor) else a
    return q * a, k, 1.0 / math.sqrt(ctx.head_dim)


def _toy_formula(q, k, scale, p, ctx):
    a = per_head(p["a"])
    a = a.to(q.dtype) if isinstance(a, torch.Tensor) else a
    return a * dot_logits(q, k) / math.sqrt(q.shape[-1])


TOY = Score(
    name="toy",
    summary="a·q·k/√d, a learnable per head (a test score)",
    defaults={"a": 1.0},
    positive=("a",),
    uses_scale=False,
    prepare=_toy_prepare,
    formula=_toy_formula,
    label="toy: a·q·k/√d",
    tex=r"$a\,q\cdot k/\sqrt{d}$",
    learnable={"a": per_head_value("a")},
    bench_params={"a": 0.5},
    dot_factor=lambda d, n, p: float(p["a"]) / math.sqrt(d),
)

SMALL = ["--d-model", "16", "--heads", "2", "--layers", "1", "--batch-size", "4",
         "--seq-len", "32", "--eval-size", "64", "--steps", "2"]


@pytest.fixture
def toy():
    with registered(TOY) as score:
        yield score
    assert "toy" not in SCORES  # the registry is restored


def test_registered_only_inside_the_block(toy) -> None:
    assert SCORES["toy"] is toy
    with pytest.raises(ValueError, match="already registered"), registered(TOY):
        pass


def test_attention_and_module(toy) -> None:
    q, k, v = (torch.randn(1, 2, 5, 8, dtype=torch.float64) for _ in range(3))
    out = attention(q, k, v, score="toy", a=2.0, is_causal=True)
    ref = reference_attention(q, k, v, score="toy", a=2.0, is_causal=True)
    torch.testing.assert_close(out, ref)
    m = MultiheadSelfAttention(16, 2, score="toy", a=0.5)
    torch.testing.assert_close(m.learned_params()["a"].detach(), torch.full((2,), 0.5))


def test_bench_rows_include_it(toy) -> None:
    assert bench.bench_params("toy") == {"a": 0.5}
    rows, _ = bench.run(n_values=[16], causal_values=[False], batch=1, heads=1, head_dim=8,
                        repeats=1, naive=False)
    assert "toy" in {r.score for r in rows}


def test_theory_and_monte_carlo_use_its_hook(toy) -> None:
    assert "toy" in th.stat_scores() and "toy" in th.init_scores()
    # a/√d with a = 2 at d = 16 is µP's c/d with c = 8: the same exact law
    exact = th.score_moments(16, 64, "toy", a=2.0)
    assert exact.entropy == pytest.approx(th.score_moments(16, 64, "mup").entropy, rel=1e-12)
    est = mc.mc_score_stats(16, 64, "toy", samples=2000, seed=3, method="vectors", a=2.0)
    for quantity in th.QUANTITIES:
        assert est[quantity].agrees(exact.get(quantity), 4.0), quantity
    assert th.init_logit_std(64, 16, 0.125, "toy", a=2.0) == pytest.approx(2.0)  # a·σ², σ² = 1
    rows = mc.theory_table(samples=200, ds=(16,), ns=(64,), scores={"toy": ("toy", {"a": 2.0})})
    assert {r["score"] for r in rows} == {"toy"}
    assert all(mc.Estimate(r["mc_mean"], r["mc_se"]).agrees(r["theory"], 4.0) for r in rows)


def test_train_command(toy, capsys) -> None:
    from attnscale import cli

    code = cli.run(["train", *SMALL, "--score", "toy", "--score-params", "a=2", "--json"])
    out = capsys.readouterr().out
    assert code == 0, capsys.readouterr().err
    record = json.loads(out)
    assert record["config"]["score"] == "toy" and record["config"]["score_params"] == {"a": 2.0}
    assert record["history"][0]["layers"][0]["a"] == pytest.approx(2.0)  # learned, logged


def test_sweep(toy, tmp_path, monkeypatch) -> None:
    from attnscale.lab import executors, sweep
    from attnscale.lab.store import Store

    # Workers forked from this process see the score registered here; forkserver or spawn
    # workers would need the register() call in a module they import.
    monkeypatch.setattr(sweep, "make_executor",
                        lambda kind, workers, address: executors.LocalExecutor(workers,
                                                                                context="fork"))
    spec = sweep.parse_spec("""
name = "toy"
[base]
task = "mqar"
score = "toy"
steps = 2
d_model = 16
n_heads = 2
n_layers = 1
batch_size = 4
seq_len = 32
eval_size = 64
stats = false
[axes]
score_params = [{a = 0.5}, {a = 2.0}]
""")
    counts = sweep.run_sweep(spec, tmp_path / "runs.db")
    assert counts.done == 2, counts
    with Store(tmp_path / "runs.db") as store:
        runs = store.runs()
    assert sorted(r["config"]["score_params"]["a"] for r in runs) == [0.5, 2.0]
    assert {r["config"]["score"] for r in runs} == {"toy"}


def test_figures_pick_up_its_label(toy) -> None:
    curves = theory_plots.score_curves(16, (8, 64))
    assert TOY.tex in curves and len(curves[TOY.tex]) == 2
    page = explorer.explorer_data(n_exps=(3, 3), d_exps=(4, 4))["scores"]["toy"]
    assert page["label"] == TOY.label and page["factor"] == [[0.25]]  # a/√d at a = 1, d = 16
