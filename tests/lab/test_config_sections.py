"""TrainConfig in sections: one field, three spellings; the flat form and the run ids of runs
stored before the sections; the task union; the model mapped to GPTConfig by name."""

from __future__ import annotations

import inspect
from dataclasses import fields

import pytest
from pydantic import ValidationError

from attnscale.lab.build import build_model, build_task, gpt_config
from attnscale.lab.config import SCORE_PARAMS, TASK_OPTIONS, TrainConfig
from attnscale.lab.models import GPTConfig
from attnscale.lab.sections import (
    FIELDS,
    TASK_SECTIONS,
    ModelSection,
    OptimSection,
    TextTask,
    error_path,
    field_info,
    flatten,
    path_of,
)
from attnscale.lab.sweep import config_id, expand, is_current, parse_spec, resolve
from attnscale.lab.tasks import TASKS

# Ids computed by the flat TrainConfig before it had sections (run ids of stored results).
IDS_BEFORE_SECTIONS = {
    (): "84b5cc216f4a3223",
    (("task", "text"),): "6255d85d2cf6c1b5",
    (("task", "length"),): "bda2c5bc3a81f81f",
    (("task", "salience"), ("cue", "none")): "c846f926647e4c23",
    (("qk_clip", 100.0), ("score", "dot")): "31109fe853617012",
}


@pytest.mark.parametrize("given", list(IDS_BEFORE_SECTIONS))
def test_run_ids_are_those_of_the_flat_config_before_sections(given):
    assert config_id(resolve(dict(given))) == IDS_BEFORE_SECTIONS[given]


# A config as the flat TrainConfig stored it (every task's options, None where not its task's).
STORED_BEFORE_SECTIONS = {
    "absorb_scale": False, "adam_eps": 1e-08, "batch_size": 64, "beta1": 0.9, "beta2": 0.95,
    "c": None, "cap": None, "cue": "none", "cue_at": None, "d_model": 128,
    "divergence_factor": 3.0, "eps": None, "eval_batch_size": None, "eval_every": None,
    "eval_multipliers": None, "eval_size": None, "eval_windows": None, "grad_clip": 1.0,
    "init": "gpt2", "init_std": 0.02, "jitter": None, "layout": None, "log_every": 25,
    "lr": 0.001, "min_lr_ratio": 0.1, "mlp": True, "n_heads": 1, "n_kv_heads": None,
    "n_layers": 2, "num_fillers": None, "num_item_tokens": None, "num_items": None,
    "num_keys": None, "num_kv_pairs": None, "num_pairs": None, "num_values": None,
    "pos": "learned", "power_a": None, "s": None, "salient_scale": None, "scale": None,
    "score": "scaled_dot", "score_params": {}, "seed": 0, "seq_len": None, "stats": True,
    "stats_batch": 16, "steps": 2000, "task": "salience", "tau": None, "temperature": "fixed",
    "text": None, "threads": 1, "tie_embeddings": True, "vocab_size": None, "warmup_steps": 100,
    "weight_decay": 0.0001, "z_loss": 0.0,
}


def test_a_config_stored_before_sections_loads_and_is_current():
    config = TrainConfig(**STORED_BEFORE_SECTIONS)
    assert config.task.name == "salience" and config.task.cue == "none"
    assert config.flat() == STORED_BEFORE_SECTIONS
    run = {"id": "c846f926647e4c23", "config": STORED_BEFORE_SECTIONS}
    assert is_current(run) and config_id(config.flat()) == run["id"]


def test_three_spellings_of_one_config_are_equal():
    flat = TrainConfig(task="text", eval_windows=4, d_model=64, lr=3e-3, log_every=5)
    paths = TrainConfig(**{"task.name": "text", "task.eval_windows": 4, "model.d_model": 64,
                           "optim.lr": 3e-3, "run.log_every": 5})
    nested = TrainConfig(task={"name": "text", "eval_windows": 4}, model={"d_model": 64},
                         optim={"lr": 3e-3}, run={"log_every": 5})
    objects = TrainConfig(task=TextTask(eval_windows=4), model=ModelSection(d_model=64),
                          optim=OptimSection(lr=3e-3), log_every=5)
    assert flat == paths == nested == objects
    assert flat.model.d_model == 64 and flat.optim.lr == 3e-3 and flat.run.log_every == 5
    assert isinstance(flat.task, TextTask) and flat.task.eval_windows == 4


def test_both_dumps_round_trip():
    config = TrainConfig(task="length", score="softcap", cap=30.0, d_model=32, n_heads=2,
                         qk_clip=None, steps=50)
    assert TrainConfig(**config.flat()) == config
    assert TrainConfig(**config.model_dump()) == config
    assert TrainConfig.model_validate_json(config.model_dump_json()) == config


def test_task_defaults_apply_only_where_the_user_left_a_field_unset():
    assert TrainConfig(task="length").model.pos == "rope"
    assert TrainConfig(task="length", pos="none").model.pos == "none"
    assert TrainConfig(model={"mlp": True}).model.mlp and not TrainConfig().model.mlp


@pytest.mark.parametrize(("given", "words"), [
    ({"task": "text", "vocab_size": 8}, "vocab_size is not an option of task 'text'"),
    ({"task": {"name": "text", "vocab_size": 8}}, "vocab_size is not an option of task 'text'"),
    ({"text": "x.txt"}, "text is only for task 'text', not 'mqar'"),
    ({"task": "nope"}, "task must be one of"),
    ({"task": None}, "task must be one of"),
    ({"model.lr": 1.0}, "unknown TrainConfig field 'model.lr'"),
    ({"d_modle": 8}, "unknown TrainConfig field 'd_modle' \\(did you mean 'd_model'\\?\\)"),
    ({"d_model": 8, "model": {"d_model": 16}}, "model.d_model is given twice"),
    ({"optim": 3}, "optim must be a table of its fields"),
    ({"model": {"d_model": 0}}, "greater than or equal to 1"),
])
def test_bad_configs_name_the_field(given, words):
    with pytest.raises(ValidationError, match=words):
        TrainConfig(**given)


def test_replace_validates_the_new_config_and_works_out_its_defaults_again():
    config = TrainConfig(score="dot", steps=40)
    assert config.replace(seed=3).seed == 3 and config.replace(seed=3).optim.steps == 40
    assert config.replace(**{"model.d_model": 64}).model.d_model == 64
    assert config.replace(steps=20) == TrainConfig(score="dot", steps=20)  # warmup 2, not 4
    assert TrainConfig().replace(task="length").model.pos == "rope"  # the new task's default
    assert TrainConfig(pos="none").replace(task="length").model.pos == "none"  # a user's choice
    with pytest.raises(ValidationError, match="num_kv_pairs is not an option of task 'text'"):
        TrainConfig(num_kv_pairs=2).replace(task="text")
    with pytest.raises(ValidationError, match="warmup_steps"):
        config.replace(warmup_steps=41)
    with pytest.raises(ValidationError, match="absorb_scale"):
        config.replace(score="scaled_dot", absorb_scale=True)


def test_errors_name_a_path_one_can_type():
    with pytest.raises(ValidationError) as bad:
        TrainConfig(task="salience", seq_len=1)
    assert [error_path(e["loc"]) for e in bad.value.errors()] == ["task.seq_len"]
    assert error_path(("model", "d_model")) == "model.d_model"


def test_an_option_of_several_tasks_has_each_ones_help():
    assert field_info("layout").description == (
        "salience layout: pairs or items. length layout: fused or pairs.")
    assert field_info("layout", "length").description.startswith("length layout")
    assert field_info("eval_size") is TASK_SECTIONS["mqar"].model_fields["eval_size"]


def test_flat_names_are_unique_and_paths_name_their_section():
    assert path_of("d_model") == "model.d_model" and path_of("task") == "task.name"
    assert path_of("seed") == "seed" and path_of("eval_windows") == "task.eval_windows"
    assert flatten({"model.d_model": 8, "optim": {"lr": 0.1}, "seed": 2}) == {
        "d_model": 8, "lr": 0.1, "seed": 2}
    assert len(resolve({})) == len(FIELDS) - 1  # qk_clip is left out while off


def test_each_task_section_holds_its_task_classes_options():
    for name, cls in TASKS.items():
        accepted = set(inspect.signature(cls.__init__).parameters) - {"self", "seed", "path"}
        own = set(TASK_SECTIONS[name].model_fields) - {"name", "text"}
        assert own == accepted, name
    assert set(TASK_OPTIONS) | {"seq_len", "text", "task"} == {
        n for n, where in FIELDS.items() if where == "task"}


def test_the_model_section_reaches_gpt_config_by_name():
    """No model field is dropped on the way to the model: each is a GPTConfig field of the same
    name, a score parameter (folded into score_params) or absorb_scale (applied by build)."""
    gpt = {f.name for f in fields(GPTConfig)}
    assert set(ModelSection.model_fields) - gpt == {"absorb_scale", *SCORE_PARAMS}
    config = TrainConfig(d_model=48, n_heads=3, n_kv_heads=1, n_layers=1, init="unit",
                         init_std=0.05, tie_embeddings=False, mlp=True, score="cosine",
                         tau=2.0, temperature="fixed", pos="none")
    task = build_task(config)
    made = gpt_config(config, task)
    for name in set(ModelSection.model_fields) & gpt - {"score_params"}:
        assert getattr(made, name) == getattr(config.model, name), name
    assert made.score_params == {"tau": 2.0}
    assert (made.vocab_size, made.seq_len) == (task.vocab_size, task.seq_len)
    assert build_model(config, task).config == made


def test_sweeps_read_section_paths_as_flat_names():
    base = "[base]\ntask = 'mqar'\nsteps = 3\n"
    flat = expand(parse_spec(base + "d_model = 16\n[axes]\nlr = [0.1, 0.01]\n"))
    paths = expand(parse_spec(
        "[base]\ntask.name = 'mqar'\noptim.steps = 3\nmodel.d_model = 16\n"
        "[axes]\n\"optim.lr\" = [0.1, 0.01]\n"))
    variant = expand(parse_spec(base + "[axes]\nlr = [0.1, 0.01]\n"
                                "[[variant]]\nname = 'v'\nmodel.d_model = 16\n"))
    assert [p.id for p in flat] == [p.id for p in paths] == [p.id for p in variant]
    with pytest.raises(ValueError, match="variant 'v' sets \\['lr'\\], which are also axes"):
        parse_spec(base + "[axes]\nlr = [0.1]\n[[variant]]\nname = 'v'\noptim.lr = 0.2\n")
