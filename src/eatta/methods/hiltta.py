"""HILTTA (Li et al., TMLR 2025): a few labels per batch both train the model and choose a
label-free method's hyperparameter as the stream goes.

Learned from the authors' code (github.com/Yushu-Li/HILTTA: ``hiltta.py``, ``main.py``,
``conf.py``, ``methods/``, ``run.sh``); written anew. Per batch ``x`` of ``B`` samples:

1. **Predict and select.** The current model's logits (returned, computed before any update) and
   features; K-Margin (:mod:`eatta.selection.kmargin`) picks ``k`` samples, which the annotator
   labels. The rest of the batch is the *unlabelled part*.
2. **Candidates.** For each value of the grid in order, the value is set on the base method (its
   learning rate, or ETA's ``d_margin``) and the base takes one adaptation step on the unlabelled
   part; a copy of the model, the base's optimizer and the base's state is kept after each step.
   As in the authors' loop, the model is *carried* from one candidate to the next: candidate
   ``j`` is the model after ``j + 1`` successive steps with the first ``j + 1`` values, not one
   step from the same start.
3. **Model selection** (only when labels came): each candidate copy predicts on the unlabelled
   part followed by the labelled pool (one forward pass, the model's adaptation mode). Its
   *anchor loss* is the mean squared difference between its softmax and the source model's (the
   *anchor*: the model as given, before :func:`eatta.configure`; by default, ``anchor_stats=
   "batch"``, its BatchNorm layers normalise with the statistics of the anchor's input, the
   unlabelled part and the labelled pool together, and with ``"running"`` with the source
   model's running statistics) on the unlabelled part; its
   *CE* is the cross-entropy on the labelled pool. Each list is min-max normalised over the
   candidates (``(v - min) / max``; a list of equal values becomes all 1), the two are added,
   and an exponential moving average over batches, ``s ← m·s + (1 - m)·r`` (``m = 0.5``; the
   first batch's ``r`` starts it), scores the candidates; the lowest wins (the first on a tie).
   Without labels, the first candidate wins and the average is left alone.
4. The winning copy is loaded. **TENT, ETA**: the model, the base's optimizer (its momentum and
   the chosen value) and the base's state (ETA's probability average), as the authors' loop,
   which takes a deep copy of the whole method. **SAR**: the authors' SAR path reloads the
   model's state and ``SAM.state_dict()``, which holds SAM's own state and the chosen rate but
   not the inner SGD's momentum buffers; so the model and the rate are the winner's, while the
   SGD's momentum and SAR's loss average stay as the last candidate's step left them
   (``sar_momentum="last"``, the default). ``sar_momentum="chosen"`` loads the winner's
   momentum too (see docs/hiltta.md for what it changes).
5. **Supervised step.** One step of a separate optimizer over *all* the model's parameters
   (Adam, lr 1e-5: ``ACTIVE.LR`` in ``main.py``) on the cross-entropy of the labelled samples,
   computed from a forward pass of the whole batch.

Grids (``run.sh``): TENT and SAR tune the learning rate over 5e-5 ... 5e-3 (7 values), EATA the
cosine threshold ``d_margin`` over 0.05 ... 1.0 (7 values). The library's base methods are
``tent``, ``eta`` (EATA without the Fisher regularizer, which needs source data) and ``sar``.

Deviations, each deliberate:

* Labels per batch are the library's ``budget`` (``k = min(budget, B - 2)``: two samples stay
  unlabelled so the base can normalise on them), not ``int(B · ACTIVE.RATE)``. The EATTA paper's
  HILTTA† rows ("3 samples per batch", batch 64) are ``budget=3`` (rate 3/64 ≈ 0.047; the code's
  default rate 0.032 gives 2 labels at batch 64). See docs/hiltta.md.
* The candidate copies live within a step, as in the authors' loop; what a step leaves behind
  (the model, both optimizers, the base's state, the score average) is saved by
  ``state_dict()``, so a stream resumes bit-identically.
* With an asynchronous annotator, answers that arrive late join the labelled pool of the step
  they arrive in (their kept inputs appended to the supervised forward pass); with a zero-delay
  annotator the step is the synchronous one, bit for bit.
* SAR's recovery, with a threshold above 0 (the default is 0.0, as ``SAR.RESET_CONSTANT_EM``
  in ``conf.py``: never): it is :class:`~eatta.methods.sar.SAR`'s own, which restores the
  initial momentum and keeps the loss average, where the authors' HILTTA code keeps the
  momentum (it reloads SAM's state only) and clears the average.
* The anchor's normalisation is an option (the same outputs as theirs either way). Their
  ``main.py`` builds the anchor with ``get_model``, which puts RobustBench models in eval mode
  but leaves torchvision/timm models (their ImageNet runs) in train mode: BatchNorm then
  normalises with the statistics of the anchor's input. The default, ``anchor_stats="batch"``,
  does the same without updating running buffers; ``anchor_stats="running"`` uses the source
  model's running statistics (their CIFAR path).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from typing_extensions import Unpack

from eatta.annotate.asking import DEFAULT_LABEL_EXPIRY
from eatta.annotate.oracle import Oracle
from eatta.balance import NoClassBalance
from eatta.budget import Budget
from eatta.configure import batch_statistics_of, configure
from eatta.methods.active import ActiveMethod
from eatta.methods.base import AdaptiveMethod, Options, read_logits
from eatta.methods.config import ActiveConfig, ParamSelection, hparam
from eatta.methods.eta import ETA
from eatta.methods.presets import DATASET_PRESETS
from eatta.methods.registry import MethodSpec, make_optimizer, register
from eatta.methods.sar import SAM, SAR, sar_params
from eatta.methods.tent import Tent
from eatta.selection.kmargin import KMarginSelector

__all__ = ["DEFAULT_GRIDS", "HILTTA", "HILTTARecord", "min_max", "smooth"]

#: The authors' grids (run.sh), per tuned hyperparameter.
LR_GRID = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3)
D_MARGIN_GRID = (0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0)
#: tuned hyperparameter -> the authors' grid for it.
GRIDS: dict[str, tuple[float, ...]] = {"lr": LR_GRID, "d_margin": D_MARGIN_GRID}
#: base method -> (tuned hyperparameter, grid), as in run.sh.
DEFAULT_GRIDS: dict[str, tuple[str, tuple[float, ...]]] = {
    "tent": ("lr", LR_GRID),
    "eta": ("d_margin", D_MARGIN_GRID),
    "sar": ("lr", LR_GRID),
}
_BASES: dict[type, str] = {Tent: "tent", ETA: "eta", SAR: "sar"}


def min_max(values: Sequence[float]) -> Tensor:
    """HILTTA's normalisation: ``v - min``, then divided by its maximum (all 1 when the values
    are equal: 1e-6 is added to an all-zero list before dividing). float64."""
    v = torch.tensor(list(values), dtype=torch.float64)
    v = v - v.min()
    if float(v.max()) == 0.0:
        v = v + 1e-6
    return v / v.max()


def smooth(previous: Tensor | None, current: Tensor, momentum: float) -> Tensor:
    """The score average: ``current`` on the first batch, else ``m·previous + (1 - m)·current``."""
    if previous is None:
        return current.clone()
    return previous * momentum + current * (1.0 - momentum)


@dataclass
class HILTTARecord:
    """What one HILTTA step did."""

    logits: Tensor
    selected: Tensor
    labels: Tensor
    late: int = 0
    anchor_losses: list[float] = field(default_factory=list)
    ce_losses: list[float] = field(default_factory=list)
    ranks: Tensor | None = None  # normalised anchor + normalised CE, this batch
    scores: Tensor | None = None  # the average after this batch
    chosen: int = 0
    value: float = 0.0
    supervised_loss: Tensor | None = None


@dataclass
class _Copy:
    model: dict[str, Tensor]
    optimizer: dict[str, Any]
    base: dict[str, Any]
    value: float


class HILTTA(ActiveMethod):
    """K-Margin labels choose among one-step candidates of a label-free method, then train.

    Args:
        model: the classifier, configured in place for the base (the base holds it too).
        base: a :class:`~eatta.methods.tent.Tent`, :class:`~eatta.methods.eta.ETA` or
            :class:`~eatta.methods.sar.SAR` around ``model``.
        oracle: ``oracle(selected_inputs, indices) -> labels``, or an asynchronous annotator
            (class labels).
        budget: labels per batch (>= 1), or a :class:`~eatta.budget.Budget`.
        candidates: the values tried per batch, in order (default: the base's grid of run.sh).
        tune: ``"lr"`` or ``"d_margin"`` (ETA only); default: the base's, as in run.sh.
        anchor: the source model (default: the method's copy of the model as it was given,
            :attr:`~eatta.AdaptiveMethod.given`, running statistics included).
        anchor_stats: ``"batch"`` (the anchor's BatchNorm layers normalise with the statistics
            of its input, as the authors' ImageNet anchor in train mode) or ``"running"``.
        active_optimizer: optimizer of the supervised step (default Adam, lr ``active_lr``,
            over all of the model's parameters, as ``main.py``).
        active_lr: its learning rate when it is built here (1e-5).
        score_momentum: momentum of the score average (0.5).
        label_expiry: steps an asynchronous request waits before it expires.
        sar_momentum: SAR base only, the base optimizer's state after a choice: ``"last"``
            (the authors' loop: the momentum buffers stay as the last candidate's step left
            them, only the chosen rate is set) or ``"chosen"`` (the chosen candidate's
            momentum, saved with its copy). TENT and ETA always get the chosen candidate's, as
            the authors' ``deepcopy`` of the whole method does.
        options: what every method takes (:class:`~eatta.methods.base.Options`); give the base
            the same ``split``, ``autocast`` and ``channels_last`` (``create`` does).
    """

    optimizer: torch.optim.Optimizer  # the base's
    selects_every_batch = True  # as their loop: K-Margin runs on every batch, k = 0 included
    _base: AdaptiveMethod  # set with object.__setattr__: not a submodule

    def __init__(
        self,
        model: nn.Module,
        base: AdaptiveMethod,
        *,
        oracle: Oracle,
        budget: int | Budget = 3,
        candidates: Sequence[float] | None = None,
        tune: str | None = None,
        anchor: nn.Module | None = None,
        anchor_stats: str = "batch",
        active_optimizer: torch.optim.Optimizer | None = None,
        active_lr: float = 1e-5,
        score_momentum: float = 0.5,
        label_expiry: int = DEFAULT_LABEL_EXPIRY,
        sar_momentum: str = "last",
        **options: Unpack[Options],
    ) -> None:
        name = _BASES.get(type(base))
        if name is None:
            raise TypeError(
                "HILTTA's base must be a Tent, ETA or SAR (the label-free methods its code "
                f"supports), got {type(base).__name__}"
            )
        if base.model is not model:
            raise ValueError("the base method must wrap the same model")
        default_tune = DEFAULT_GRIDS[name][0]
        tune = default_tune if tune is None else tune
        if tune not in ("lr", "d_margin") or (tune == "d_margin" and name != "eta"):
            raise ValueError(f"HILTTA tunes 'lr' (any base) or 'd_margin' (eta); got {tune!r}")
        grid = _check_candidates(GRIDS[tune] if candidates is None else candidates, tune)
        budget = Budget.coerce(budget)
        if budget.per_batch < 1:
            raise ValueError(
                f"HILTTA needs at least one label per batch (budget={budget.per_batch}): its "
                "labels choose the candidate and train the model"
            )
        if anchor_stats not in ("batch", "running"):
            raise ValueError(f"anchor_stats must be 'batch' or 'running', got {anchor_stats!r}")
        if sar_momentum not in ("last", "chosen"):
            raise ValueError(f"sar_momentum must be 'last' or 'chosen', got {sar_momentum!r}")
        if not 0.0 <= score_momentum <= 1.0:
            raise ValueError(f"score_momentum must be in [0, 1], got {score_momentum!r}")
        if not active_lr >= 0.0:
            raise ValueError(f"active_lr must be >= 0, got {active_lr!r}")
        if base.optimizer is None:
            raise TypeError("HILTTA's base method needs an optimizer (its lr is tuned)")
        super().__init__(
            model, base.optimizer, oracle=oracle, budget=budget, label_expiry=label_expiry,
            **options,
        )  # fmt: skip
        object.__setattr__(self, "_base", base)  # not a submodule: its model is ours
        self.base_name, self.tune, self.candidates = name, tune, grid
        self.selector = KMarginSelector()
        self.balance = NoClassBalance()
        if anchor is not None:
            anchor = anchor.requires_grad_(False).eval()
        self._anchor = anchor  # None: the method's copy of the model as given
        self.anchor_stats = anchor_stats
        self.sar_momentum = sar_momentum
        self.active_optimizer = active_optimizer or torch.optim.Adam(
            model.parameters(), lr=active_lr
        )
        self._initial_active = copy.deepcopy(self.active_optimizer.state_dict())
        self._active_params = [p for g in self.active_optimizer.param_groups for p in g["params"]]
        self.score_momentum = float(score_momentum)
        self.scores: Tensor | None = None
        self._initial_value = self.value
        self.last_step: HILTTARecord | None = None

    # -- the base and its hyperparameter ---------------------------------------------------
    @property
    def anchor(self) -> nn.Module:
        """The source model the candidates are compared with (frozen, eval mode)."""
        return self.given if self._anchor is None else self._anchor

    @property
    def base(self) -> AdaptiveMethod:
        """The label-free method whose hyperparameter is chosen."""
        return self._base

    @property
    def value(self) -> float:
        """The tuned hyperparameter's current value."""
        if self.tune == "lr":
            return float(self.optimizer.param_groups[0]["lr"])
        base = self.base
        assert isinstance(base, ETA)  # d_margin: checked in __init__
        return base.d_margin

    def _set(self, value: float) -> None:
        if self.tune == "lr":
            for group in self.optimizer.param_groups:
                group["lr"] = value
        else:
            base = self.base
            assert isinstance(base, ETA)  # d_margin: checked in __init__
            base.d_margin = value

    # -- the step --------------------------------------------------------------------------
    def forward_and_adapt(self, x: Tensor) -> Tensor:
        with torch.no_grad():
            z, o = self.features_and_logits(x)
        batch = x.shape[0]
        k = max(0, min(self.budget.allowance(), batch - 2))
        answers = self.ask(x, z, o, k, self.selector, self.balance)
        lab_idx, lab_y = answers.indices, answers.targets
        selected = lab_idx if answers.selection is None else answers.selection.indices
        late = [a for a in answers.late if a.label is not None]  # class answers only
        mask = torch.ones(batch, dtype=torch.bool)
        mask[selected] = False
        unl = mask.nonzero().flatten().to(x.device)
        pool_x = x[lab_idx.to(x.device)]
        pool_y = lab_y.to(x.device)
        late_x = x.new_zeros((0, *x.shape[1:]))
        if late:
            late_x = torch.stack([a.request.sample for a in late]).to(x.device, x.dtype)
            late_y = torch.tensor([a.label for a in late], dtype=torch.long, device=x.device)
            pool_x, pool_y = torch.cat([pool_x, late_x]), torch.cat([pool_y, late_y])
        record = HILTTARecord(logits=o.detach(), selected=lab_idx, labels=lab_y, late=len(late))

        start, scores = self._copy(), self.scores  # the rollback point (their saved_model[0])
        try:
            copies = []
            for value in self.candidates:  # carried: each step starts where the last ended
                self._set(value)
                self.base.forward_and_adapt(x[unl])
                copies.append(self._copy())
            best = 0
            if len(pool_y):
                best = self._choose(x[unl], pool_x, pool_y, copies, record)
            sar = self.base_name == "sar"
            self._load(
                copies[best],
                optimizer_state=not sar or self.sar_momentum == "chosen",
                base_state=not sar,
            )
            record.chosen, record.value = best, float(self.candidates[best])
            if len(pool_y):
                late_rows = batch + torch.arange(len(late_x), device=x.device)
                rows = torch.cat([lab_idx.to(x.device), late_rows])
                record.supervised_loss = self._supervised(torch.cat([x, late_x]), rows, pool_y)
        except BaseException:
            self._load(start, optimizer_state=True, base_state=True)
            self.scores = scores
            raise
        self.charge(answers)
        self.asking.committed()
        record.scores = None if self.scores is None else self.scores.clone()
        self.last_step = record
        return o.detach()

    def _choose(
        self, xu: Tensor, pool_x: Tensor, pool_y: Tensor, copies: list[_Copy], record: HILTTARecord
    ) -> int:
        """Score every candidate copy; update the average; the lowest average wins."""
        inputs = torch.cat([xu, pool_x])
        n = xu.shape[0]
        with torch.no_grad(), batch_statistics_of(self.anchor, self.anchor_stats == "batch"):
            if self._anchor is None:  # the model as given, read as the adapted model is
                given = self.given_logits(inputs)[:n].softmax(dim=1)
            else:
                given = read_logits(self._anchor(inputs), self._anchor)[:n].softmax(dim=1)
            anchor_losses, ce_losses = [], []
            for c in copies:
                self.model.load_state_dict(c.model)
                out = self.logits(inputs)
                anchor_losses.append(float(F.mse_loss(out[:n].softmax(dim=1), given)))
                ce_losses.append(float(F.cross_entropy(out[n:], pool_y)))
        ranks = min_max(anchor_losses) + min_max(ce_losses)
        self.scores = smooth(self.scores, ranks, self.score_momentum)
        record.anchor_losses, record.ce_losses, record.ranks = anchor_losses, ce_losses, ranks
        return int(torch.argmin(self.scores))

    def _supervised(self, inputs: Tensor, rows: Tensor, labels: Tensor) -> Tensor:
        """One step of the active optimizer on the labelled rows' cross-entropy."""
        flags = [p.requires_grad for p in self._active_params]
        try:
            for p in self._active_params:
                p.requires_grad_(True)
            loss = F.cross_entropy(self.logits(inputs)[rows], labels)
            grads = torch.autograd.grad(loss, self._active_params, allow_unused=True)
            for p, g in zip(self._active_params, grads, strict=True):
                p.grad = g
            self.active_optimizer.step()
        finally:
            self.active_optimizer.zero_grad(set_to_none=True)
            for p, flag in zip(self._active_params, flags, strict=True):
                p.requires_grad_(flag)
        return loss.detach()

    def _copy(self) -> _Copy:
        return _Copy(
            {k: v.detach().clone() for k, v in self.model.state_dict().items()},
            copy.deepcopy(self.optimizer.state_dict()),
            copy.deepcopy(self.base.method_state()),
            self.value,
        )

    def _load(self, c: _Copy, *, optimizer_state: bool, base_state: bool) -> None:
        """Load a copy's model and value; its optimizer state (momentum) and its base's state
        when asked (else they stay as the last candidate left them)."""
        self.model.load_state_dict(c.model)
        if optimizer_state:
            self.optimizer.load_state_dict(copy.deepcopy(c.optimizer))
        if base_state:
            self.base.load_method_state(copy.deepcopy(c.base))
        self._set(c.value)

    # -- state -------------------------------------------------------------------------------
    def state_parts(self) -> dict[str, Any]:
        return {**self.asking_parts(), "selector": self.selector}

    def reset_method_state(self) -> None:
        super().reset_method_state()
        self.base.reset_method_state()
        self.active_optimizer.load_state_dict(copy.deepcopy(self._initial_active))
        self.scores = None
        self._set(self._initial_value)

    def method_state(self) -> dict[str, Any]:
        state = super().method_state()
        state["hiltta"] = {
            "base": self.base.method_state(),
            "active_optimizer": self.active_optimizer.state_dict(),
            "scores": None if self.scores is None else self.scores.clone(),
            "value": self.value,
        }
        return state

    def load_method_state(self, state: dict[str, Any]) -> None:
        super().load_method_state(state)
        own = state.get("hiltta")
        if own is None:
            return
        self.base.load_method_state(copy.deepcopy(own["base"]))
        self.active_optimizer.load_state_dict(copy.deepcopy(own["active_optimizer"]))
        scores = own.get("scores")
        self.scores = None if scores is None else scores.detach().to("cpu", torch.float64).clone()
        self._set(float(own["value"]))

    def state_signature(self) -> dict[str, Any]:
        signature = super().state_signature()
        signature["hiltta"] = [self.base_name, self.tune, len(self.candidates)]
        return signature


def _check_candidates(candidates: Any, tune: str) -> tuple[float, ...]:
    if isinstance(candidates, str | bytes) or not isinstance(candidates, Sequence):
        raise TypeError(
            f"candidates must be a sequence of numbers, got {type(candidates).__name__}"
        )
    if len(candidates) == 0:
        raise ValueError("candidates is empty: HILTTA needs at least one value to try")
    out = []
    for c in candidates:
        if isinstance(c, bool) or not isinstance(c, int | float):
            raise TypeError(f"each candidate must be a number, got {type(c).__name__} {c!r}")
        if not math.isfinite(c) or c <= 0:
            raise ValueError(f"each candidate {tune} must be finite and > 0, got {c!r}")
        out.append(float(c))
    return tuple(out)


# -- registry ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HILTTAConfig(ActiveConfig):
    """HILTTA's keys. The base's optimizer follows the authors' configuration: SGD, momentum
    0.9, Nesterov for TENT/ETA (``conf.py``), plain momentum under SAR's SAM (``methods/sar.py``);
    ``lr`` is the base's rate where the grid tunes something else (ETA's ``d_margin``).
    ``base="sar"`` also sets ``nesterov=False`` and ``params="sar"`` unless given."""

    EXPANSIONS: ClassVar[Mapping[str, Mapping[Any, Mapping[str, Any]]]] = {
        "base": {"sar": {"nesterov": False, "params": "sar"}}
    }

    base: Literal["tent", "eta", "sar"] = hparam("tent", "the label-free method tuned")
    candidates: tuple[float, ...] | None = hparam(
        None, "values tried per batch, in order (None: the base's grid in run.sh)"
    )
    tune: Literal["lr", "d_margin"] | None = hparam(
        None, "hyperparameter chosen (None: lr for tent/sar, d_margin for eta)"
    )
    nesterov: bool = hparam(True, "SGD Nesterov momentum (base='sar' sets False)")
    params: Literal["sar"] | ParamSelection = hparam(
        "norm", "parameters the base adapts (base='sar' sets 'sar': SAR's norm layers)"
    )
    active_lr: float = hparam(1e-5, "Adam rate of the supervised step (ACTIVE.LR)", min=0.0)
    score_momentum: float = hparam(0.5, "momentum of the score average", min=0.0, max=1.0)
    anchor_stats: Literal["batch", "running"] = hparam(
        "batch", "the anchor's BatchNorm: input statistics (their ImageNet) or running ones"
    )
    d_margin: float = hparam(0.05, "ETA's cosine threshold when it is not tuned", min=0.0)
    entropy_margin: float | None = hparam(
        None, "reliability threshold E0 of eta/sar (None: 0.4 ln C)", min=0.0
    )
    rho: float = hparam(0.05, "SAM radius (sar)", min=0.0)
    reset_constant: float = hparam(0.0, "SAR's recovery threshold (0: never)", min=0.0)
    sar_momentum: Literal["last", "chosen"] = hparam(
        "last", "SAR base: SGD momentum after a choice: the last candidate's (theirs) or chosen's"
    )
    buffer: int | None = hparam(None, "replay buffer: HILTTA keeps none (None or 0 only)", min=0)


def _build_base(model: nn.Module, cfg: HILTTAConfig) -> AdaptiveMethod:
    # every base's keys are read, so a key given for another base is still checked and seen
    margin, d_margin = cfg.entropy_margin, cfg.d_margin
    rho, reset_constant = cfg.rho, cfg.reset_constant
    params = sar_params(model) if cfg.params == "sar" else configure(model, cfg.params)
    opt = make_optimizer(params, cfg)
    if cfg.base == "tent":
        return Tent(model, opt, **cfg.options())
    if cfg.base == "eta":
        return ETA(model, opt, entropy_margin=margin, d_margin=d_margin, **cfg.options())
    return SAR(
        model, SAM(opt, rho=rho), entropy_margin=margin, reset_constant=reset_constant,
        **cfg.options(),
    )  # fmt: skip


def _build_hiltta(
    model: nn.Module, cfg: HILTTAConfig, oracle: Oracle | None, budget: Budget, **parts: Any
) -> AdaptiveMethod:
    assert oracle is not None
    if budget.per_batch < 1:  # before the model is configured
        raise ValueError(
            f"HILTTA needs at least one label per batch (budget={budget.per_batch}): its labels "
            "choose the candidate and train the model"
        )
    if cfg.buffer:
        raise ValueError(
            f"HILTTA keeps no replay buffer (its labels serve the batch they came with), got "
            f"buffer={cfg.buffer}"
        )
    if cfg.candidates is not None:
        _check_candidates(cfg.candidates, cfg.tune or DEFAULT_GRIDS[cfg.base][0])
    if cfg.tune == "d_margin" and cfg.base != "eta":
        raise ValueError(f"tune='d_margin' needs base='eta', got base={cfg.base!r}")
    base = _build_base(model, cfg)
    return HILTTA(
        model,
        base,
        oracle=oracle,
        budget=budget,
        candidates=cfg.candidates,
        tune=cfg.tune,
        anchor_stats=cfg.anchor_stats,
        active_lr=cfg.active_lr,
        score_momentum=cfg.score_momentum,
        **cfg.options(),
        label_expiry=cfg.label_expiry,
        sar_momentum=cfg.sar_momentum,
        **parts,
    )


register(
    MethodSpec(
        "hiltta",
        _build_hiltta,
        active=True,
        config=HILTTAConfig,
        datasets=DATASET_PRESETS["hiltta"],
        summary="HILTTA: K-Margin labels pick a label-free method's lr per batch, then train",
    )
)
