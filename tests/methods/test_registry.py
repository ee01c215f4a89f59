"""The method registry: strict typed hyperparameters, per-dataset presets, split=, top-level API."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import eatta
from conftest import confident_cnn, image_batches
from eatta.bench import api, cli, commands
from eatta.methods import registry
from eatta.methods.config import MethodConfig
from eatta.methods.presets import DATASET_PRESETS, DATASETS
from eatta.methods.tent import TentConfig

METHODS = registry.available()
NUM_CLASSES = 5


def annotator(inputs: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """An oracle answering with arbitrary (fixed) classes."""
    return idx % NUM_CLASSES


def required(name: str) -> dict[str, Any]:
    """Keyword arguments ``create`` needs for ``name`` beyond the model."""
    kw: dict[str, Any] = {}
    if registry.get_spec(name).active:
        kw["oracle"] = annotator
    if name == "eata":
        kw["fisher_data"] = image_batches(2)
    if name == "cotta":
        kw["num_augmentations"] = 2
    if name == "simatta":
        kw["steps"] = 1
    return kw


def model_state(model: nn.Module) -> tuple[Any, ...]:
    """Everything ``configure`` and the builders may change: values, modes, BN setup, grads."""
    return (
        {k: v.detach().clone() for k, v in model.state_dict().items()},
        [(n, p.requires_grad, p.is_contiguous()) for n, p in model.named_parameters()],
        [(n, m.training) for n, m in model.named_modules()],
        [
            (n, m.track_running_stats, m.running_mean is None)
            for n, m in model.named_modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm)
        ],
    )


def same_state(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return (
        a[1:] == b[1:]
        and a[0].keys() == b[0].keys()
        and all(torch.equal(a[0][k], b[0][k]) for k in a[0])
    )


# -- unknown keys and bad values ------------------------------------------------------------------


@pytest.mark.parametrize("name", METHODS)
def test_unknown_key_names_the_key_the_method_and_the_known_keys(name):
    model = confident_cnn()
    before = model_state(model)
    with pytest.raises(TypeError) as err:
        eatta.create(name, model, lrr=0.1, **required(name))
    text = str(err.value)
    assert "'lrr'" in text and repr(name) in text
    for key in registry.get_spec(name).keys:
        assert key in text
    if "lr" in registry.get_spec(name).keys:
        assert "did you mean 'lr'?" in text
    assert same_state(before, model_state(model))


LABEL_FREE = [n for n in METHODS if not registry.get_spec(n).active]
ACTIVE = [n for n in METHODS if registry.get_spec(n).active]


@pytest.mark.parametrize("name", LABEL_FREE)
@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({"oracle": annotator}, "oracle"),
        ({"budget": 3}, "budget"),
        ({"budget": 0}, "budget"),
        ({"oracle": annotator, "budget": 3}, "oracle, budget"),
        ({"label_expiry": 8}, "label_expiry"),
        ({"buffer": 4}, "buffer"),
    ],
)
def test_a_label_free_method_refuses_label_arguments(name, given, named):
    """``create("tent", model, oracle=..., budget=3)`` once ignored both silently."""
    model = confident_cnn()
    before = model_state(model)
    with pytest.raises(TypeError) as err:
        eatta.create(name, model, **{**required(name), **given})
    text = str(err.value)
    assert f"method {name!r} is label-free" in text
    assert f"takes no {named};" in text
    assert "the methods that take labels are " + ", ".join(ACTIVE) in text
    assert same_state(model_state(model), before)


@pytest.mark.parametrize("name", ACTIVE)
def test_an_active_method_takes_oracle_and_budget_with_a_default_of_one(name):
    assert eatta.create(name, confident_cnn(), **required(name)).budget.per_batch == 1
    got = eatta.create(name, confident_cnn(), budget=3, **required(name))
    assert got.budget.per_batch == 3


def test_every_unknown_key_is_listed():
    with pytest.raises(TypeError, match="'lrr' \\(did you mean 'lr'\\?\\), 'stepz'"):
        eatta.create("tent", confident_cnn(), lrr=0.1, stepz=2)


@pytest.mark.parametrize(
    ("name", "key", "value", "error"),
    [
        ("tent", "lr", "abc", TypeError),
        ("tent", "steps", 1.5, TypeError),
        ("tent", "steps", True, TypeError),  # a bool is not a number
        ("tent", "nesterov", "yes", TypeError),
        ("tent", "betas", (0.9,), TypeError),
        ("eatta", "gnd", "yes", TypeError),
        ("eatta", "buffer", 2.5, TypeError),
        ("eatta", "split", (nn.Identity(),), TypeError),
        ("eatta", "selector_kwargs", [1], TypeError),
        ("eata", "fishers", {"w": 1.0}, TypeError),
        ("tent", "optimizer", "rmsprop", ValueError),
        ("eatta", "preset", "bogus", ValueError),
        ("eatta", "selector", "best", ValueError),
        ("eatta", "grad_mode", "fast", ValueError),
        ("tent", "params", "heads", ValueError),
        ("tent", "steps", 0, ValueError),
        ("tent", "lr", -1e-3, ValueError),
        ("tent", "lr", float("nan"), ValueError),
        ("eatta", "ema_alpha", 1.5, ValueError),
    ],
)
def test_bad_value_names_the_key_and_leaves_the_model_alone(name, key, value, error):
    model = confident_cnn()
    before = model_state(model)
    kw = {**required(name), key: value}
    with pytest.raises(error, match=f"'{key}' of method '{name}'"):
        eatta.create(name, model, **kw)
    assert same_state(before, model_state(model))


def test_a_failure_after_configuring_restores_the_model():
    """Nesterov without momentum passes the config but fails in torch.optim.SGD, after
    configure() changed the model: create() undoes that."""
    model = confident_cnn()
    before = model_state(model)
    assert model.training
    with pytest.raises(ValueError, match="Nesterov"):
        eatta.create("tent", model, momentum=0.0)
    assert same_state(before, model_state(model))
    eatta.create("tent", model)  # and the model is still usable
    assert not model.training


def test_values_are_converted_where_unambiguous():
    cfg = registry.get_spec("tent").config_for("default", {"lr": 1, "betas": [0.5, 0.6]})
    assert isinstance(cfg, TentConfig)
    assert cfg.lr == 1.0 and isinstance(cfg.lr, float)
    assert cfg.betas == (0.5, 0.6)


def test_unknown_dataset_key_is_an_error():
    with pytest.raises(ValueError, match="imagenet_c"):
        eatta.create("tent", confident_cnn(), dataset="imagenet_c")


def test_presets_are_validated_at_registration():
    def build(*args: Any) -> Any:
        raise AssertionError("never built")

    with pytest.raises(TypeError, match="'lrr'"):
        registry.MethodSpec("x", build, config=TentConfig, datasets={"pacs": {"lrr": 1.0}})
    with pytest.raises(ValueError, match="mnist"):
        registry.MethodSpec("x", build, config=TentConfig, datasets={"mnist": {"lr": 1.0}})


# -- per-dataset defaults -------------------------------------------------------------------------


@pytest.mark.parametrize("name", METHODS)
@pytest.mark.parametrize("dataset", ["default", *DATASETS])
def test_defaults_are_the_config_with_the_dataset_row(name, dataset):
    spec = registry.get_spec(name)
    want = {**spec.config.defaults(), **DATASET_PRESETS[name].get(dataset, {})}
    cfg = spec.config_for(dataset, {})
    assert cfg.to_dict() == want
    assert spec.hparams(dataset, {}) == want
    if "lr" not in want:
        return
    m = eatta.create(name, confident_cnn(), dataset=dataset, **required(name))
    group = m.optimizer.param_groups[0]
    assert group["lr"] == want["lr"]
    base = getattr(m.optimizer, "base_optimizer", m.optimizer)  # SAR wraps it in SAM
    assert type(base).__name__.lower() == want["optimizer"]
    if want["optimizer"] == "sgd":
        assert (group["momentum"], group["nesterov"]) == (want["momentum"], want["nesterov"])


def test_every_method_has_a_preset_row_set():
    assert set(DATASET_PRESETS) == set(METHODS)


# -- the config documents what the builder reads ---------------------------------------------------


def _recording(cfg: MethodConfig, seen: set[str]) -> MethodConfig:
    keys = set(type(cfg).keys())

    class Recording(type(cfg)):  # type: ignore[misc]
        def __getattribute__(self, item: str) -> Any:
            if item in keys:
                seen.add(item)
            return super().__getattribute__(item)

    return Recording(**cfg.to_dict())


@pytest.mark.parametrize("name", METHODS)
def test_builder_reads_every_declared_key(name):
    """Every declared key reaches the method (none is accepted and ignored); building with
    every key given explicitly at its default works."""
    spec = registry.get_spec(name)
    seen: set[str] = set()
    variants = [{}]
    if "optimizer" in spec.keys:
        variants.append({"optimizer": "adam"})  # betas are read for Adam, momentum for SGD
    for extra in variants:
        kw = required(name)
        oracle = kw.pop("oracle", None)
        cfg = spec.config_for("default", {**kw, **extra})
        spec.build(confident_cnn(), _recording(cfg, seen), oracle, eatta.Budget(1))
    expanded = set(spec.config.EXPANSIONS)  # consumed when the config is made
    assert set(spec.keys) - expanded <= seen, set(spec.keys) - expanded - seen
    explicit = {**spec.config.defaults(), **required(name)}
    oracle = explicit.pop("oracle", None)
    given = eatta.create(name, confident_cnn(), oracle=oracle, **explicit)
    implicit = eatta.create(name, confident_cnn(), **required(name))
    assert type(given) is type(implicit)
    assert repr(given.optimizer) == repr(implicit.optimizer)


# -- split= ---------------------------------------------------------------------------------------


class ConvHeadNet(nn.Module):
    """Features from a small conv stem; logits from a 1x1 convolution, not a Linear layer, so the
    backbone/head split cannot be found automatically."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.scorer = nn.Sequential(
            nn.Unflatten(1, (width, 1, 1)), nn.Conv2d(width, NUM_CLASSES, 1), nn.Flatten()
        )
        with torch.no_grad():
            self.scorer[1].weight.mul_(8.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scorer(self.stem(x))


@pytest.mark.parametrize("name", METHODS)
def test_every_builder_honours_split(name):
    model = ConvHeadNet()
    m = eatta.create(name, model, split=(model.stem, model.scorer), **required(name))
    assert m.split.backbone is model.stem and m.split.head is model.scorer
    out = m(torch.rand(16, 3, 8, 8))
    assert out.shape == (16, NUM_CLASSES) and torch.isfinite(out).all()


# -- top level ------------------------------------------------------------------------------------


def test_top_level_api_is_the_registry():
    assert eatta.create is registry.create and eatta.available is registry.available
    assert eatta.available() == METHODS
    assert isinstance(eatta.create("tent", confident_cnn()), eatta.AdaptiveMethod)


def test_every_method_registers_on_import():
    """Importing any part of the package registers every built-in method, before any call to
    the registry (a fresh interpreter importing only the registry module reads its table)."""
    code = "import eatta.methods.registry as r; print(','.join(sorted(r._REGISTRY)))"
    src = str(Path(eatta.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().split(",") == METHODS
    assert {"eatta", "eatta-safe", "tent", "cema", "simatta", "baseline", "source"} <= set(METHODS)


def test_describe_lists_keys_defaults_and_dataset_values():
    text = eatta.describe("tent")
    cfg = dataclasses.fields(TentConfig)
    assert all(f"  {f.name}: " in text for f in cfg)
    assert f"pacs: {DATASET_PRESETS['tent']['pacs']['lr']!r}" in text
    assert f"lr: float = {TentConfig.defaults()['lr']!r}" in text


# -- eatta-bench --hp ------------------------------------------------------------------------------


@pytest.fixture
def no_data(monkeypatch):
    """Fail if the CLI gets as far as loading data."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("data was loaded")

    monkeypatch.setattr(api, "load_benchmarks", refuse)


@pytest.mark.parametrize(
    ("hp", "methods", "needles"),
    [
        ("tent.lrr=0.1", "tent", ["'lrr'", "did you mean 'lr'?", "'tent'", "steps"]),
        ("lrr=0.1", "tent,eatta", ["'lrr'", "did you mean 'lr'?", "tent, eatta"]),
        ("buffer=4", "tent", ["none of the methods tent has", "'buffer'", "their keys are"]),
        ("nope=4", "tent,cema", ["tent, cema", "'nope'", "alpha", "steps"]),
        ("eatta.gnd=yes", "eatta", ["'gnd'", "bool", "'yes'"]),
        ("tent.steps=1.5", "tent", ["'steps'", "int"]),
        ("tent.optimizer=rmsprop", "tent", ["'optimizer'", "'sgd', 'adam'"]),
    ],
)
def test_cli_rejects_bad_hp_before_loading_data(hp, methods, needles, capsys, no_data):
    assert cli.main(["--methods", methods, "--hp", hp, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("eatta-bench: error: --hp: ")
    for needle in needles:
        assert needle in err


def test_cli_all_methods_key_applies_to_those_that_declare_it():
    got = commands.parse_hparams(["buffer=4", "lr=1e-3", "tent.lr=0.5"], ["tent", "eatta"])
    assert got == {"tent": {"lr": 0.5}, "eatta": {"buffer": 4, "lr": 1e-3}}
    # a method's own key wins whatever the order
    assert commands.parse_hparams(["tent.lr=0.5", "*.lr=1"], ["tent"]) == {"tent": {"lr": 0.5}}
    assert commands.parse_hparams(["optimizer=adam"], ["source", "tent"])["source"] == {}
