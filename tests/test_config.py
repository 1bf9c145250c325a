"""Config validation: one located, readable error per problem (file:line, dotted path, expected,
received, did-you-mean), exit code 2 and no traceback; --set overrides; validate/schema."""

from __future__ import annotations

import json

import pytest

from magmadnn_cli.config.layers import ActivationName, InitializerName
from magmadnn_cli.config.schema import Layer, Loss, Optimizer, Schedule, union_tags
from magmadnn_cli.config.loading import load_config
from magmadnn_cli.errors import ConfigError
from magmadnn_cli.core.graph import ACTIVATIONS
from magmadnn_cli.distributed.strategies import config_problems
from magmadnn_cli.nn.initializers import FACTORIES, INITIALIZERS
from magmadnn_cli.nn.layers import LAYERS
from magmadnn_cli.nn.losses import LOSSES
from magmadnn_cli.nn.optimizers import OPTIMIZERS
from typing import get_args

from conftest import BLOBS_CONFIG, ROOT, run_cli


def _errors_for(tmp_path, text: str, *overrides: str) -> str:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides, checks=(config_problems,))  # as the commands load a config
    return str(info.value)


def _replace(old: str, new: str) -> str:
    assert old in BLOBS_CONFIG
    return BLOBS_CONFIG.replace(old, new)


@pytest.mark.parametrize("old,new,expected", [
    # unknown key, with the allowed keys and a suggestion
    ("  normalize: standard", "  normalise: standard",
     [r"c.yaml:8: data.normalise: unknown key 'normalise'", "did you mean 'normalize'?"]),
    # misspelt layer type
    ("    - {type: dense, units: 3,", "    - {type: dens, units: 3,",
     [r"c.yaml:12: model.layers.1: unknown type 'dens'", "expected one of: input, dense", "did you mean 'dense'?"]),
    # wrong type
    ("  epochs: 15", "  epochs: many",
     [r"c.yaml:16: training.epochs: expected a valid integer", "received: 'many'"]),
    # out-of-range value
    ("learning_rate: 0.01", "learning_rate: -1",
     [r"c.yaml:14: optimizer.learning_rate: expected greater than 0", "received: -1"]),
    # misspelt activation
    ("units: 16, activation: relu", "units: 16, activation: rleu",
     [r"c.yaml:11: model.layers.0.activation: invalid value", "received: 'rleu'", "did you mean 'relu'?"]),
    # loss vs output activation
    ("units: 3, activation: softmax", "units: 3, activation: relu",
     ["c.yaml:13: loss: cross_entropy needs a final softmax activation (model.layers.1.activation); received 'relu': "
      "set model.layers.1.activation: softmax"]),
    # whole-config checks at the key to fix, not the file's first line
    ("units: 3, activation: softmax", "units: 3, activation: softmax, name: dense_0",
     ["c.yaml:12: model.layers.1: named 'dense_0', like model.layers.0: weights are saved by layer name"]),
    ("loss: cross_entropy\noptimizer: {type: adam, learning_rate: 0.01}\ntraining:\n",
     "loss: mse\noptimizer: {type: adam, learning_rate: 0.01}\ntraining:\n  class_weight: balanced\n",
     ["c.yaml:16: training.class_weight: class_weight weighs classes; loss mse is a regression loss"]),
    # a section's key at the top level (an indentation slip)
    ("loss: cross_entropy\n", "loss: cross_entropy\nbatch_size: 8\n",
     ["batch_size: unknown key 'batch_size'", "did you mean training.batch_size? (indent it under training:)"]),
    # several 0/1 target columns are a multi-label target, which only a binary loss trains
    ("  target: label", "  target: [label, f1]",
     ["loss: data.target lists 2 0/1 columns, one per label (multi-label), which loss cross_entropy does not train: "
      "use loss: binary_cross_entropy"]),
    ("  target: label", "  target: [label, label]", ["data.target: the target lists 'label' twice"]),
    # a YAML word in missing_tokens
    ("  normalize: standard", "  normalize: standard\n  missing_tokens: [-999, yes]",
     ["c.yaml:9: data.missing_tokens: YAML reads yes, no, on, off, true, false and null as other things"]),
    # missing required section
    ("loss: cross_entropy\n", "", ["loss: missing required key 'loss'"]),
    # a staleness bound without asynchronous SGD; asynchronous SGD with split layers
    ("loss: cross_entropy\n", "loss: cross_entropy\ndistributed: {max_staleness: 2}\n",
     ["distributed: max_staleness bounds asynchronous SGD; strategy is 'auto': set strategy: async"]),
    ("loss: cross_entropy\n", "loss: cross_entropy\ndistributed: {strategy: async, model_parallel: 2}\n",
     ["distributed: strategy async serves whole models from one rank; model_parallel > 1 splits them"]),
    ("loss: cross_entropy\n", "loss: cross_entropy\ndistributed: {strategy: async, max_staleness: -1}\n",
     ["distributed.max_staleness: expected greater than or equal to 0", "received: -1"]),
])
def test_config_errors_are_located_and_explained(tmp_path, old, new, expected):
    message = _errors_for(tmp_path, _replace(old, new))
    for part in expected:
        assert part in message, message


def test_every_whole_config_problem_is_reported_at_once_each_at_its_key(tmp_path):
    """A duplicate layer name, mse on a softmax output and class_weight on a regression took three
    fix-and-rerun rounds ('invalid config (1 problem)' each time)."""
    text = _replace("units: 3, activation: softmax}", "units: 3, activation: softmax, name: dense_0}")
    text = text.replace("loss: cross_entropy", "loss: mse").replace("  batch_size: 16", "  batch_size: 16\n  class_weight: balanced")
    message = _errors_for(tmp_path, text)
    assert "invalid config (3 problems):" in message, message
    for part in ("c.yaml:12: model.layers.1: named 'dense_0'", "c.yaml:13: loss: mse is a regression loss",
                 "c.yaml:18: training.class_weight: class_weight weighs classes"):
        assert part in message, message


def test_several_problems_are_all_reported(tmp_path):
    text = _replace("  epochs: 15", "  epochs: -1\n  batchsize: 3")
    message = _errors_for(tmp_path, text)
    assert "invalid config (2 problems)" in message
    assert "training.epochs" in message and "did you mean 'batch_size'?" in message


def test_yaml_problems(tmp_path):
    assert "c.yaml:3:" in _errors_for(tmp_path, "name: x\nseed: 1\n  bad: [\n")
    assert "duplicate key 'seed'" in _errors_for(tmp_path, "name: x\nseed: 1\nseed: 2\n")
    message = _errors_for(tmp_path, "name: !!python/object/apply:os.system ['echo hi']\n")
    assert "tags that build Python objects are not allowed" in message
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))
    assert "alias bomb" in _errors_for(tmp_path, bomb)
    assert "expected a mapping of sections" in _errors_for(tmp_path, "- just\n- a list\n")


@pytest.mark.parametrize("text,line,shown,fix", [
    ("name: x\ndata:\n  train: a.csv\n   target: y\n", 4, "   target: y", "indented deeper"),
    ("name: x\n\tseed: 1\n", 2, "\tseed: 1", "spaces, not tabs"),
    ("name: x\ndata: {train: a.csv, target: y\nseed: 1\n", 3, "seed: 1", "not closed"),
    ("name: x\nmodel:\n  layers: [dense, relu\n", 4, "", "not closed"),
    ("name: 'x\nseed: 1\n", 3, "", "quote"),
])
def test_yaml_syntax_errors_show_the_line_and_a_fix(tmp_path, text, line, shown, fix):
    message = _errors_for(tmp_path, text)
    assert f"c.yaml:{line}:" in message and fix in message, message
    if shown:
        assert f"line {line}: {shown!r}" in message, message


def test_missing_and_directory_config(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path)


def test_set_overrides_are_merged_and_revalidated(blobs):
    cfg = load_config(blobs, ["training.epochs=3", "model.layers.0.units=32", "optimizer.type=sgd",
                              "optimizer.momentum=0.5", "data.normalize=minmax"])
    assert cfg.training.epochs == 3
    assert cfg.model.layers[0].units == 32
    assert cfg.optimizer.type == "sgd" and cfg.optimizer.momentum == 0.5
    with pytest.raises(ConfigError, match=r"--set training.epochs=-2: training.epochs: expected greater than or equal to 0"):
        load_config(blobs, ["training.epochs=-2"])
    with pytest.raises(ConfigError, match="no list item 5"):
        load_config(blobs, ["model.layers.5.units=3"])
    with pytest.raises(ConfigError, match="expected dotted.key=value"):
        load_config(blobs, ["training.epochs"])


def test_paths_resolve_relative_to_the_config_file(blobs, tmp_path, monkeypatch):
    monkeypatch.chdir("/")
    cfg = load_config(blobs)
    assert cfg.data.train == tmp_path / "blobs.csv"
    assert cfg.seed == 1


def test_a_missing_seed_is_drawn_and_recorded(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(BLOBS_CONFIG.replace("seed: 1\n", ""))
    (tmp_path / "blobs.csv").write_text("f1,label\n1,a\n")
    assert isinstance(load_config(path).seed, int)


def test_registries_and_schema_tags_are_the_same_sets():
    shipped = {tag for tag, cls in LAYERS.items() if cls.__module__.startswith("magmadnn_cli")}  # not tests' own
    assert union_tags(Layer) == shipped
    assert union_tags(Loss) == set(LOSSES)
    assert union_tags(Optimizer) == set(OPTIMIZERS)
    assert union_tags(Schedule) == {"constant", "step", "exponential", "cosine"}
    assert set(get_args(ActivationName)) == set(ACTIVATIONS)
    assert set(get_args(InitializerName)) | {"constant"} == set(INITIALIZERS) | set(FACTORIES)


def test_validate_command_prints_resolved_config(capsys, blobs):
    code, out, err = run_cli(capsys, "validate", blobs, "--set", "training.epochs=4")
    assert code == 0
    assert "epochs: 4" in out and "eval_batch_size: 1024" in out and "seed: 1" in out
    assert "valid" in err and "text columns" not in err
    csv = blobs.parent / "blobs.csv"
    lines = csv.read_text().splitlines()
    csv.write_text("\n".join([lines[0] + ",color"] + [f"{line},{'rgb'[i % 3]}" for i, line in enumerate(lines[1:])]))
    code, out, err = run_cli(capsys, "validate", blobs)  # what train would say of the data, before training
    said = " ".join(err.split())
    assert code == 0 and "columns read as categories (one-hot), booleans or dates: color (category, 3 values)" \
        in said and said.endswith("valid"), said


def test_validate_command_reports_errors_with_exit_2_and_no_traceback(capsys, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(_replace("    - {type: dense, units: 3,", "    - {type: dropot, units: 3,"))
    code, out, err = run_cli(capsys, "validate", path)
    assert code == 2
    assert "bad.yaml:12: model.layers.1: unknown type 'dropot'" in err
    assert "Traceback" not in err + out


def test_schema_command_emits_json_schema(capsys):
    code, out, _ = run_cli(capsys, "schema")
    schema = json.loads(out)
    assert code == 0
    assert schema["additionalProperties"] is False
    assert {"data", "model", "loss", "optimizer"} <= set(schema["required"])


def test_the_readme_config_reference_shows_the_real_defaults():
    """Every key the README's reference block sets, other than the required ones, equals the schema's
    default: the block validates to the same config as its required keys alone."""
    import re

    import yaml

    from magmadnn_cli.config.schema import Config
    text = (ROOT / "README.md").read_text()
    block = yaml.safe_load(re.search(r"```yaml\n(# Every key below shows its default.*?)```", text, re.S).group(1))
    required = {"name": block["name"], "data": {"train": block["data"]["train"], "target": block["data"]["target"]},
                "model": block["model"], "loss": block["loss"], "optimizer": {"type": block["optimizer"]["type"]}}
    assert Config.model_validate(block).model_dump() == Config.model_validate(required).model_dump()


@pytest.mark.parametrize("override,where", [
    ("model.layers.0={type: dense}", "--set model.layers.0={type: dense}: model.layers.0.units: missing required key"),
    ("loss=mse", "--set loss=mse: loss: mse is a regression loss, but the final activation (model.layers.1.activation) "
                 "is 'softmax', which gives class probabilities: for classes use loss: cross_entropy"),
    ("training.epochs=abc", "--set training.epochs=abc: training.epochs"),
    # a section's own check, set off by a --set inside a section the file does not have
    ("distributed.max_staleness=2", "--set distributed.max_staleness=2: distributed: max_staleness bounds"),
])
def test_set_mistakes_point_at_the_set_argument(override, where, capsys, blobs):
    code, _, err = run_cli(capsys, "validate", blobs, "--set", override)
    assert code == 2 and where in " ".join(err.split()), err


def test_a_file_name_with_spaces_gives_a_safe_run_name_and_a_bad_name_says_what_is_allowed(capsys, tmp_path):
    from conftest import BLOBS_CONFIG, blobs_csv
    blobs_csv(tmp_path / "blobs.csv")
    config = tmp_path / "my blobs (v2).yaml"
    config.write_text(BLOBS_CONFIG.replace("name: blobs\n", ""))
    assert load_config(config).name == "my_blobs__v2_"
    code, _, err = run_cli(capsys, "validate", config, "--set", "name=a/b")
    assert code == 2 and "name: not a safe name" in err and "expected letters, digits, _ . -" in err, err


def test_a_model_file_given_as_the_config_is_named_as_such(capsys, tmp_path):
    import numpy as np
    np.savez(tmp_path / "model.npz", a=np.zeros(3))
    code, _, err = run_cli(capsys, "validate", tmp_path / "model.npz")
    assert code == 2 and "a zip or .npz file (a model file?" in err and "not a YAML config" in err, err


def test_a_revised_config_is_validated_and_keeps_where_it_was_read_from():
    """`revised` checks each change as loading does (pydantic's model_copy checks nothing) and keeps
    the config's source, so a later error still names its file and line."""
    from pydantic import ValidationError
    from magmadnn_cli.config.loading import load_config
    config = load_config(ROOT / "configs" / "iris.yaml")
    revised = config.revised(seed=7, training=config.training.revised(epochs=3))
    assert (revised.seed, revised.training.epochs, revised.model) == (7, 3, config.model)
    assert revised.where("training", "epochs") == config.where("training", "epochs") is not None
    with pytest.raises(ValidationError, match="greater than 0"):
        config.optimizer.revised(learning_rate=-1.0)
    with pytest.raises(ValidationError, match="class_weight"):  # the model's own rules run again
        config.revised(loss={"type": "mse"}, training=config.training.revised(class_weight="balanced"))
    with pytest.raises(TypeError, match="no field 'epoch'"):
        config.training.revised(epoch=3)


def test_the_run_seed_is_defaulted_in_one_place_only():
    """A config's seed is its own or drawn once (`seeded`); runtime code reads `Config.run_seed`, the
    one default, and never re-defaults `config.seed` itself."""
    import re
    config = load_config(ROOT / "configs" / "iris.yaml").revised(seed=None)  # as ranks load it: not drawn yet
    assert config.seed is None and config.run_seed == 0 and config.revised(seed=9).run_seed == 9
    package = ROOT / "magmadnn_cli"
    found = [f"{p.relative_to(package)}:{i}" for p in sorted(package.rglob("*.py")) if "config" not in p.parts
             for i, line in enumerate(p.read_text().splitlines(), 1)
             if re.search(r"\.seed (or|if .* else) ", line)]
    assert not found, found
