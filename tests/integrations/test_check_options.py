"""attnscale check's options and inputs beyond the rules: tokenizers without a pad token,
folders without a tokenizer (PATH and --baseline), --skip-file, and --baseline's growth flags."""

from __future__ import annotations

import math

import pytest
from check_support import check_json, heads_flagged, save_tiny_bert, save_tiny_gpt2, skip_args

from attnscale.cli import run as cli_run
from attnscale.integrations import checkup as C
from attnscale.measure import inspection as I

FLAGGED = 1


def result_of(*stds: float) -> dict:
    """A check result with one layer of heads of these logit stds (n = 50, otherwise healthy)."""
    base = {"max_abs_logit": 6.0, "entropy_uniform": math.log(50), "entropy_normalized": 0.8,
            "saturated_fraction": 0.0}
    return {"layers": [{"layer": 0, "heads": [{**base, "head": i, "logit_std": s}
                                              for i, s in enumerate(stds)]}]}


# -- tokenizers without a pad token, folders without a tokenizer ------------------------------

@pytest.mark.parametrize("eos", [True, False])
def test_a_tokenizer_without_a_pad_token_is_checked(eos, tmp_path, capsys):
    """GPT-2's tokenizer has no pad token: check pads with EOS on the right (padding never
    counts), or, without EOS either, runs the inputs one at a time; the numbers agree either
    way. The GPT-2 is freshly initialized, so its heads average: flagged near-uniform."""
    pytest.importorskip("transformers")
    folder = save_tiny_gpt2(tmp_path / "gpt2", eos=eos)
    code, res = check_json([str(folder)], capsys)
    assert (code, res["n_sentences"]) == (FLAGGED, 64)
    assert {f["kind"] for f in res["flags"]} == {"uniform"} and len(res["flags"]) == 4
    if eos:  # the same inputs one at a time measure the same heads
        one = C.check_model(str(folder), batch_size=1)
        assert one["n_tokens"] == res["n_tokens"]
        for a, b in zip(res["layers"], one["layers"], strict=True):
            for ha, hb in zip(a["heads"], b["heads"], strict=True):
                assert ha["logit_std"] == pytest.approx(hb["logit_std"], rel=1e-4)
                assert ha["entropy_normalized"] == pytest.approx(hb["entropy_normalized"],
                                                                 rel=1e-4)


def test_a_missing_pad_token_becomes_eos_on_the_right(tmp_path):
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(save_tiny_gpt2(tmp_path / "g", eos=True))
    tok.padding_side = "left"
    assert I.ensure_pad_token(tok) and tok.pad_token == "<eos>" and tok.padding_side == "right"
    bare = AutoTokenizer.from_pretrained(save_tiny_gpt2(tmp_path / "n", eos=False))
    assert not I.ensure_pad_token(bare) and bare.pad_token is None


@pytest.mark.parametrize("flag", ["", "--baseline"])
def test_a_folder_without_a_tokenizer_is_one_line_and_exit_2(flag, tmp_path, capsys):
    """Named by the argument that gave it, before any model is read."""
    pytest.importorskip("transformers")
    bare = save_tiny_gpt2(tmp_path / "bare", tokenizer=False)
    args = [str(bare)] if not flag else [str(save_tiny_gpt2(tmp_path / "ok")), flag, str(bare)]
    code = cli_run(["check", *args])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "has no tokenizer" in err and "save_pretrained" in err
    assert (flag or "PATH") in err


# -- --skip-file ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sharp(tmp_path_factory):
    pytest.importorskip("transformers")
    return save_tiny_bert(tmp_path_factory.mktemp("sharp") / "bert", 2.0)


def test_a_skip_file_accepts_its_heads_and_names_a_bad_line(sharp, tmp_path, capsys):
    code, plain = check_json([str(sharp)], capsys)
    flagged = heads_flagged(plain)
    assert code == FLAGGED and len(flagged) >= 2
    listed = tmp_path / "known_heads.txt"
    listed.write_text(f"# sharp heads we accept\n{flagged[0]}   # the first\n\n"
                      + "\n".join(flagged[1:]) + "\n")
    code, res = check_json([str(sharp), "--skip-file", str(listed)], capsys)
    assert (code, res["healthy"], res["skip_heads"]) == (0, True, flagged)
    # a file and a flag add up
    partial = tmp_path / "one_head.txt"
    partial.write_text(flagged[0] + "\n")
    code, res = check_json([str(sharp), "--skip-file", str(partial),
                            *skip_args(flagged[1:])], capsys)
    assert (code, res["skip_heads"]) == (0, flagged)
    bad = tmp_path / "bad.txt"
    bad.write_text("0.1\nlayer two\n")
    assert cli_run(["check", str(sharp), "--skip-file", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--skip-file line 2" in err
    assert C.read_skip_file(listed) == flagged


# -- --baseline -------------------------------------------------------------------------------

def test_growth_flags_compare_each_head_with_its_baseline():
    now, then = result_of(2.1, 1.9, math.nan, 5.0), result_of(1.0, 1.0, 1.0, 0.0)
    found = C.growth_flags(now, then)
    assert [(f.head, f.kind) for f in found] == [(0, "grew")]
    assert (found[0].value, found[0].limit) == pytest.approx((2.1, C.GROWTH))
    assert "grew: logit std 2.10× the baseline's same head" in found[0].message()
    assert [f.head for f in C.growth_flags(now, then, growth=1.5)] == [0, 1]
    assert [f.head for f in C.growth_flags(now, then, growth=1.0)] == [0, 1]  # any growth
    with pytest.raises(ValueError, match=r"growth"):
        C.growth_flags(now, then, growth=0.99)


def test_growth_needs_the_same_layers_and_heads():
    now = result_of(1.0, 1.0)
    with pytest.raises(ValueError, match="baseline: the reference has"):
        C.growth_flags(now, result_of(1.0))
    renumbered = {"layers": [{**now["layers"][0], "layer": 1}]}
    with pytest.raises(ValueError, match="one architecture"):
        C.growth_flags(now, renumbered)


def test_no_skip_hides_growth_or_non_finite_logits():
    """A known sharp head may be accepted; one that keeps growing or turns NaN is news."""
    found = [C.Flag(0, 0, "frozen", 80.0, 70.0), C.Flag(0, 0, "grew", 9.0, 2.0),
             C.Flag(0, 1, "nonfinite", math.inf, 0.0), C.Flag(0, 2, "frozen", 90.0, 70.0)]
    res = {**result_of(1.0, 1.0, 1.0), "flags": [vars(f) for f in found]}
    C.apply_skips(res, ["0.0", "0.1", "0.2"])
    assert [(f["head"], f["kind"]) for f in res["flags"]] == [(0, "grew"), (1, "nonfinite")]
    assert [(f["head"], f["kind"]) for f in res["skipped_flags"]] == [(0, "frozen"),
                                                                     (2, "frozen")]
    assert not res["healthy"]


def test_baseline_flags_the_heads_that_grew(sharp, tmp_path, capsys):
    """The same tiny BERT with q, k × 2 (same seed): layer 0's logits are exactly × 4; layer 1,
    whose inputs changed too, grew as well."""
    pytest.importorskip("transformers")
    healthy = save_tiny_bert(tmp_path / "healthy", 0.23)
    grown = save_tiny_bert(tmp_path / "grown", 0.46)  # same seed, q and k × 2: logits × 4
    code, res = check_json([str(grown), "--baseline", str(healthy)], capsys)
    assert code == FLAGGED and {f["kind"] for f in res["flags"]} == {"grew"}
    assert heads_flagged(res) == ["0.0", "0.1", "1.0", "1.1"]
    assert [f["value"] for f in res["flags"][:2]] == pytest.approx([4.0, 4.0], rel=1e-3)
    code, res = check_json([str(grown), "--baseline", str(healthy), "--growth", "5"], capsys)
    assert (code, res["baseline"]["growth"]) == (0, 5.0)
    code, res = check_json([str(healthy), "--baseline", str(healthy)], capsys)
    assert code == 0 and res["flags"] == []
