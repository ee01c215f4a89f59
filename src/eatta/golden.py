"""Replay golden traces of the authors' reference EATTA step through the public API.

A trace (format: ``shared/golden/FORMAT.md``) records a tiny model adapting on a short stream.
:func:`replay_trace` rebuilds the model from the trace, configures :class:`~eatta.EATTA` as the
trace says, feeds it the recorded noise and ground truth, and compares every recorded field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from eatta.annotate.oracle import GroundTruthOracle
from eatta.balance import make_balance
from eatta.configure import configure
from eatta.debias import GradNormDebiaser
from eatta.methods.eatta import EATTA
from eatta.selection.perturbation import PerturbationSelector, RecordedNoise

__all__ = ["FieldReport", "ReplayReport", "TinyResNetLike", "build_model", "replay_trace"]

RTOL, ATOL = 1e-5, 1e-6
EXACT_FIELDS = ("selected", "class_history", "pseudo_labels")
FLOAT_FIELDS = (
    "logits",
    "diff",
    "loss_unsup",
    "loss_sup",
    "grad_norm_unsup",
    "grad_norm_sup",
    "gamma_unsup_raw",
    "gamma_sup_raw",
    "gamma_unsup_ema",
    "gamma_sup_ema",
    "loss",
    "params_after",
)


class TinyResNetLike(nn.Module):
    """The traces' tiny model: conv-BN-ReLU, layer1, a strided layer4, pooling, fc."""

    def __init__(self, width: int, num_classes: int) -> None:
        super().__init__()
        w = width
        self.conv1 = nn.Conv2d(3, w, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(w)
        self.relu = nn.ReLU()
        self.layer1 = nn.Sequential(
            nn.Conv2d(w, w, 3, padding=1, bias=False), nn.BatchNorm2d(w), nn.ReLU()
        )
        self.layer4 = nn.Sequential(
            nn.Conv2d(w, 2 * w, 3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(2 * w),
            nn.ReLU(),
        )
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2 * w, num_classes)

    def features(self, x: Tensor) -> Tensor:
        return torch.flatten(
            self.avgpool(self.layer4(self.layer1(self.relu(self.bn1(self.conv1(x)))))), 1
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.features(x))


class _Features(nn.Module):
    def __init__(self, net: TinyResNetLike) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: Tensor) -> Tensor:
        return self.net.features(x)


def build_model(meta: dict[str, Any]) -> TinyResNetLike:
    """The model a trace's ``model`` entry describes."""
    if meta.get("name") != "tiny_resnet_like":
        raise ValueError(f"unknown trace model {meta.get('name')!r}; expected 'tiny_resnet_like'")
    return TinyResNetLike(int(meta["width"]), int(meta["num_classes"]))


@dataclass
class FieldReport:
    """Worst mismatch of one field over all steps, relative to the tolerance (<= 1 passes)."""

    name: str
    exact: bool
    worst_ratio: float = 0.0
    worst_step: int = -1
    failures: int = 0

    @property
    def ok(self) -> bool:
        return self.failures == 0


@dataclass
class ReplayReport:
    path: str
    steps: int
    fields: dict[str, FieldReport] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(f.ok for f in self.fields.values())

    @property
    def worst_ratio(self) -> float:
        return max((f.worst_ratio for f in self.fields.values() if not f.exact), default=0.0)


def _float_ratio(got: Tensor, want: Tensor) -> float:
    got = got.detach().double().cpu().reshape(want.shape)
    want = want.double()
    err = (got - want).abs()
    tol = ATOL + RTOL * want.abs()
    return float((err / tol).max()) if err.numel() else 0.0


def _as_list(v: Any) -> list[int]:
    if isinstance(v, Tensor):
        return [int(i) for i in v.reshape(-1).tolist()]
    return [int(i) for i in v]


def replay_trace(trace: dict[str, Any] | str | Path) -> ReplayReport:
    """Replay one trace (a dict or a ``.pt`` path) and compare every recorded field."""
    if isinstance(trace, dict):
        path, data = "<dict>", trace
    else:
        path, data = str(trace), torch.load(trace, weights_only=True)
    cfg = data["config"]
    torch.manual_seed(0)
    model = build_model(data["model"])
    model.load_state_dict(data["initial_state"], strict=True)
    trainable = list(data["trainable"])
    params = configure(model, lambda mod, m, p: f"{mod}.{p}" in trainable)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    if sorted(names) != sorted(trainable):
        raise ValueError(f"could not select the trace's trainable parameters {trainable}")
    if cfg.get("optimizer", "SGD") != "SGD":
        raise ValueError(f"replay supports SGD traces, got {cfg['optimizer']}")
    opt = torch.optim.SGD(
        params,
        lr=cfg["lr"],
        momentum=cfg.get("momentum", 0.0),
        nesterov=cfg.get("nesterov", False),
        dampening=cfg.get("dampening", 0.0),
        weight_decay=cfg.get("weight_decay", 0.0),
    )
    steps = data["steps"]
    oracle = GroundTruthOracle()
    method = EATTA(
        model,
        opt,
        oracle=oracle,
        budget=int(cfg["labels_per_batch"]),
        selector=PerturbationSelector(noise=RecordedNoise([s["noise"] for s in steps])),
        balance=make_balance(cfg.get("class_history", "reference")),
        debiaser=GradNormDebiaser(alpha=cfg["ema_alpha"]),
        entropy_margin=cfg["entropy_margin"],
        split=(_Features(model), model.fc),
        window=False,  # the authors' batches, as traced: no small-batch advice
    )
    report = ReplayReport(path=path, steps=len(steps))
    for name in EXACT_FIELDS:
        report.fields[name] = FieldReport(name, exact=True)
    for name in FLOAT_FIELDS:
        report.fields[name] = FieldReport(name, exact=False)
    named = dict(model.named_parameters())
    for t, step in enumerate(steps):
        oracle.set_labels(step["y"])
        method(step["x"])
        rec = method.last_step
        assert rec is not None and rec.weights is not None
        got: dict[str, Any] = {
            "selected": rec.selected,
            "class_history": rec.class_history,
            "pseudo_labels": rec.pseudo_labels,
            "logits": rec.logits,
            "diff": rec.scores,
            "loss_unsup": rec.loss_unsup,
            "loss_sup": rec.loss_sup,
            "grad_norm_unsup": rec.grad_norm_unsup,
            "grad_norm_sup": rec.grad_norm_sup,
            "gamma_unsup_raw": rec.weights.unsup_raw,
            "gamma_sup_raw": rec.weights.sup_raw,
            "gamma_unsup_ema": rec.weights.unsup,
            "gamma_sup_ema": rec.weights.sup,
            "loss": rec.loss,
        }
        for name in EXACT_FIELDS:
            if name not in step:
                continue
            fr = report.fields[name]
            if _as_list(got[name]) != _as_list(step[name]):
                fr.failures += 1
                fr.worst_step = t if fr.worst_step < 0 else fr.worst_step
        for name in FLOAT_FIELDS:
            if name not in step:
                continue
            fr = report.fields[name]
            if name == "params_after":
                ratio = max(_float_ratio(named[k], v) for k, v in step[name].items())
            else:
                want = step[name]
                want = want if isinstance(want, Tensor) else torch.tensor(float(want))
                ratio = _float_ratio(got[name], want)
            if ratio > fr.worst_ratio or ratio != ratio:
                fr.worst_ratio, fr.worst_step = ratio, t
            if not ratio <= 1.0:
                fr.failures += 1
    return report
