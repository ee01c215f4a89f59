"""CoTTA (Wang et al., CVPR 2022): continual TTA with a mean teacher and stochastic restoring.

Per batch (following the authors' ImageNet code, github.com/qinenergy/cotta):

1. the student (the adapted model) predicts ``s = student(x)``;
2. the anchor (a frozen copy of the source model) measures confidence: the batch mean of the
   anchor's top softmax probability; when it is below ``ap_threshold`` (0.1; 0.72 on PACS) the
   teacher's prediction is the mean of its logits over ``num_augmentations`` (32) augmented copies
   of the batch, otherwise the teacher's logits on ``x``;
3. the student minimizes the symmetric cross-entropy between its softmax and the teacher's,
   ``-½ Σ p_t log p_s - ½ Σ p_s log p_t`` (batch mean, teacher detached), with one optimizer step;
4. the teacher becomes ``m · teacher + (1 - m) · student`` for every parameter (m = 0.999);
5. stochastic restore: each element of each adapted parameter goes back to its source value with
   probability ``restore_prob`` (0.01, the paper's supplement; CoTTA's ImageNet code hard-codes
   0.001, see the ``cotta`` row of :data:`eatta.methods.presets.DATASET_PRESETS`).

The returned prediction is the teacher's (augmentation-averaged when augmenting), as in CoTTA's
code; it is computed before this batch's update. All the model's ``weight`` and ``bias``
parameters are adapted (CoTTA's parameter choice).

Augmentations (``get_tta_transforms`` of the reference, re-implemented on tensors): clip to
[0, 1]; brightness 0.6-1.4, contrast 0.7-1.3, saturation 0.5-1.5, hue ±0.06, gamma 0.7-1.3 in a
random order; edge padding by half the image size; random affine (±15°, translation ≤ 1/16 of the
padded size, scale 0.9-1.1, bilinear); Gaussian blur (kernel 5, σ 0.001-0.5); center crop back to
the input size; horizontal flip with probability ½; Gaussian noise (σ 0.005); clip to [0, 1]. As in
the reference, one random draw is applied to the whole batch, so the inputs must be images in
[0, 1] (normalization inside the model). Every draw comes from a seeded ``torch.Generator`` kept
in the method's state. Each augmented batch is a separate teacher forward (BatchNorm statistics per
augmented batch, as in the reference) and the logits are summed as they come, so memory stays
that of one batch whatever the number of augmentations.

Deliberate differences from the reference: the teacher and the anchor run in the same mode as the
configured student (eval mode, BatchNorm on batch statistics) rather than ``train()``, which only
matters for models with dropout; the anchor runs without autograd.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from typing_extensions import Unpack

from eatta._compat import import_torchvision
from eatta.annotate.oracle import Oracle
from eatta.budget import Budget
from eatta.configure import batch_statistics_of, configure
from eatta.methods.base import AdaptiveMethod, Options
from eatta.methods.config import OptimizerConfig, ParamSelection, hparam
from eatta.methods.presets import DATASET_PRESETS
from eatta.methods.registry import MethodSpec, make_optimizer, register
from eatta.methods.tent import set_grads, trainable

__all__ = ["CoTTA", "CoTTARecord", "TTAAugment", "cotta_param_filter", "symmetric_cross_entropy"]


def symmetric_cross_entropy(student: Tensor, teacher: Tensor) -> Tensor:
    """Per-sample ``-½ Σ softmax(t) log softmax(s) - ½ Σ softmax(s) log softmax(t)``."""
    return -0.5 * (teacher.softmax(1) * student.log_softmax(1)).sum(1) - 0.5 * (
        student.softmax(1) * teacher.log_softmax(1)
    ).sum(1)


def cotta_param_filter(module_name: str, module: nn.Module, param_name: str) -> bool:
    """CoTTA's choice: every parameter named ``weight`` or ``bias``."""
    return param_name in ("weight", "bias")


def _uniform(g: torch.Generator, low: float, high: float) -> float:
    return low + (high - low) * float(torch.rand((), generator=g, dtype=torch.float64))


def _device_generator(g: torch.Generator, device: torch.device) -> torch.Generator:
    """A generator on ``device`` seeded from ``g`` (one CPU draw; keeps big draws on device)."""
    seed = int(torch.randint(0, 2**62, (), generator=g))
    return torch.Generator(device=device).manual_seed(seed)


class TTAAugment:
    """CoTTA's test-time augmentation on a batch of images in [0, 1] (see the module docstring).

    ``soft=True`` gives the reference's milder ranges. One random draw per call, shared by the
    whole batch; the draws come from the ``torch.Generator`` passed to :meth:`__call__`.
    """

    def __init__(self, gaussian_std: float = 0.005, soft: bool = False) -> None:
        self.gaussian_std = gaussian_std
        self.brightness = (0.8, 1.2) if soft else (0.6, 1.4)
        self.contrast = (0.85, 1.15) if soft else (0.7, 1.3)
        self.saturation = (0.75, 1.25) if soft else (0.5, 1.5)
        self.hue = (-0.03, 0.03) if soft else (-0.06, 0.06)
        self.gamma = (0.85, 1.15) if soft else (0.7, 1.3)
        self.degrees = (-8.0, 8.0) if soft else (-15.0, 15.0)
        self.scale = (0.95, 1.05) if soft else (0.9, 1.1)
        self.blur_sigma = (0.001, 0.25) if soft else (0.001, 0.5)
        self.translate = 1 / 16

    def _jitter(self, x: Tensor, g: torch.Generator, tf: Any) -> Tensor:
        channels = x.shape[-3]
        for op in torch.randperm(5, generator=g).tolist():
            if op == 0:
                x = tf.adjust_brightness(x, _uniform(g, *self.brightness))
            elif op == 1:
                factor = _uniform(g, *self.contrast)
                if channels in (1, 3):
                    x = tf.adjust_contrast(x, factor)
            elif op == 2:
                factor = _uniform(g, *self.saturation)
                if channels == 3:
                    x = tf.adjust_saturation(x, factor)
            elif op == 3:
                factor = _uniform(g, *self.hue)
                if channels == 3:
                    x = tf.adjust_hue(x, factor)
            else:
                factor = _uniform(g, *self.gamma)
                x = tf.adjust_gamma(x.clamp(1e-8, 1.0), factor)
        return x

    def __call__(self, x: Tensor, g: torch.Generator) -> Tensor:
        tv = import_torchvision()
        tf = tv.transforms.functional
        h, w = x.shape[-2:]
        x = self._jitter(x.clamp(0.0, 1.0), g, tf)
        x = tf.pad(x, [w // 2, h // 2], padding_mode="edge")
        ph, pw = x.shape[-2:]
        angle = _uniform(g, *self.degrees)
        tx = round(_uniform(g, -self.translate * pw, self.translate * pw))
        ty = round(_uniform(g, -self.translate * ph, self.translate * ph))
        scale = _uniform(g, *self.scale)
        x = tf.affine(
            x,
            angle=angle,
            translate=[tx, ty],
            scale=scale,
            shear=[0.0, 0.0],
            interpolation=tv.transforms.InterpolationMode.BILINEAR,
        )
        sigma = _uniform(g, *self.blur_sigma)
        x = tf.gaussian_blur(x, kernel_size=[5, 5], sigma=[sigma, sigma])
        x = tf.center_crop(x, [h, w])
        if float(torch.rand((), generator=g)) < 0.5:
            x = tf.hflip(x)
        noise_gen = _device_generator(g, x.device)
        noise = torch.randn(x.shape, generator=noise_gen, device=x.device, dtype=x.dtype)
        return (x + self.gaussian_std * noise).clamp(0.0, 1.0)


@dataclass
class CoTTARecord:
    """What one CoTTA step did (tensors detached)."""

    student_logits: Tensor
    teacher_logits: Tensor
    anchor_confidence: float
    augmented: bool
    loss: Tensor


class CoTTA(AdaptiveMethod):
    """Mean-teacher continual TTA with augmentation averaging and stochastic restore.

    Args:
        model: the student, configured in place (all ``weight``/``bias`` trainable in CoTTA).
        optimizer: over the student's adapted parameters (SGD lr 0.01 in the paper).
        ema_momentum: teacher momentum ``m`` (0.999).
        restore_prob: per-element probability of restoring a source weight each step (0.01).
        ap_threshold: augment when the anchor's mean top probability is below it (0.1).
        num_augmentations: augmented copies averaged by the teacher (32).
        augment: the augmentation, ``augment(x, generator) -> x'``; default :class:`TTAAugment`.
        seed: seeds the generator of the augmentations and the restore masks.
        options: what every method takes (:class:`~eatta.methods.base.Options`).

    Submodules ``teacher`` and ``anchor`` are deep copies of the model at creation; the teacher is
    saved in ``state_dict()`` and reset with the model.
    """

    optimizer: torch.optim.Optimizer  # required here (AdaptiveMethod's may be None)

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        ema_momentum: float = 0.999,
        restore_prob: float = 0.01,
        ap_threshold: float = 0.1,
        num_augmentations: int = 32,
        augment: Any = None,
        seed: int = 0,
        **options: Unpack[Options],
    ) -> None:
        if not 0.0 <= ema_momentum <= 1.0:
            raise ValueError(f"ema_momentum must be in [0, 1], got {ema_momentum!r}")
        if not 0.0 <= restore_prob <= 1.0:
            raise ValueError(f"restore_prob must be in [0, 1], got {restore_prob!r}")
        if not isinstance(num_augmentations, int) or num_augmentations < 1:
            raise ValueError(f"num_augmentations must be an integer >= 1, got {num_augmentations}")
        super().__init__(model, optimizer, **options)
        self._train = trainable(optimizer, "CoTTA")
        self.teacher = copy.deepcopy(model).requires_grad_(False)  # the mean teacher (EMA)
        self.ema_momentum = float(ema_momentum)
        self.restore_prob = float(restore_prob)
        self.ap_threshold = float(ap_threshold)
        self.num_augmentations = num_augmentations
        self.augment = augment if augment is not None else TTAAugment()
        self.seed = int(seed)
        self.generator = torch.Generator().manual_seed(self.seed)
        names = {id(p): n for n, p in model.named_parameters()}
        self._source_names = [names[id(p)] for p in self._train]
        self.last_step: CoTTARecord | None = None

    @property
    def anchor(self) -> nn.Module:
        """The frozen source model whose confidence decides the augmentation: the method's copy
        of the model as given, read on the batch's statistics as the adapted model is."""
        return self.given

    @property
    def serving_model(self) -> nn.Module:
        """The mean teacher: CoTTA serves its predictions."""
        return self.teacher

    # -- the step ----------------------------------------------------------------------------
    @torch.no_grad()
    def _teacher_prediction(self, x: Tensor) -> tuple[Tensor, float, bool]:
        with batch_statistics_of(self.given):  # the anchor: the model as given, as configured
            anchor = self.given_logits(x)
        confidence = float(anchor.softmax(dim=1).amax(dim=1).mean())
        if confidence >= self.ap_threshold:
            return self.logits_of(self.teacher, x), confidence, False
        total: Tensor | None = None
        for _ in range(self.num_augmentations):  # one augmented batch per forward: bounded memory
            out = self.logits_of(self.teacher, self.augment(x, self.generator))
            total = out if total is None else total + out
        assert total is not None
        return total / self.num_augmentations, confidence, True

    def forward_and_adapt(self, x: Tensor) -> Tensor:
        rng = self.generator.get_state()
        try:
            student = self.logits(x)
            teacher, confidence, augmented = self._teacher_prediction(x)
            loss = symmetric_cross_entropy(student, teacher.detach()).mean()
            set_grads(loss, self._train)
        except BaseException:
            self.generator.set_state(rng)
            raise
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._update_teacher()
        self._restore()
        self.last_step = CoTTARecord(
            student_logits=student.detach(),
            teacher_logits=teacher.detach(),
            anchor_confidence=confidence,
            augmented=augmented,
            loss=loss.detach(),
        )
        return teacher.detach()

    @torch.no_grad()
    def _update_teacher(self) -> None:
        m = self.ema_momentum
        for t, s in zip(self.teacher.parameters(), self.model.parameters(), strict=True):
            t.copy_(m * t + (1 - m) * s)

    @torch.no_grad()
    def _restore(self) -> None:
        if self.restore_prob <= 0.0:
            return
        source = self._initial_model
        gen: torch.Generator | None = None
        for p, name in zip(self._train, self._source_names, strict=True):
            if gen is None or gen.device != p.device:
                gen = _device_generator(self.generator, p.device)
            keep = torch.rand(p.shape, generator=gen, device=p.device) >= self.restore_prob
            p.copy_(torch.where(keep, p, source[name].to(p)))

    # -- state -------------------------------------------------------------------------------
    def reset_method_state(self) -> None:
        super().reset_method_state()
        self.teacher.load_state_dict(self._initial_model)
        self.generator.manual_seed(self.seed)

    def method_state(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state()}

    def load_method_state(self, state: dict[str, Any]) -> None:
        if state.get("generator") is not None:
            self.generator.set_state(state["generator"])


# -- registry ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CoTTAConfig(OptimizerConfig):
    """CoTTA's keys (paper supplementary: SGD lr 0.01, momentum 0.9 with Nesterov as in CoTTA's
    configuration; restore 0.01, EMA 0.999, 32 augmentations, anchor threshold 0.1); per-dataset
    values in :mod:`eatta.methods.presets`."""

    lr: float = hparam(0.01, "learning rate", min=0.0)
    nesterov: bool = hparam(True, "SGD Nesterov momentum")
    params: ParamSelection = hparam(cotta_param_filter, "parameters to adapt")
    ema_momentum: float = hparam(0.999, "EMA factor of the teacher", min=0.0, max=1.0)
    restore_prob: float = hparam(0.01, "probability of restoring a weight", min=0.0, max=1.0)
    ap_threshold: float = hparam(0.1, "anchor confidence below which to augment", min=0.0)
    num_augmentations: int = hparam(32, "augmented copies averaged when unsure", min=1)
    augment: Callable[[Tensor], Tensor] | None = hparam(None, "augmentation (None: TTAAugment)")
    seed: int = hparam(0, "seed of the augmentations and restores")


def _build_cotta(
    model: nn.Module, cfg: CoTTAConfig, oracle: Oracle | None, budget: Budget, **parts: Any
) -> AdaptiveMethod:
    params = configure(model, cfg.params)
    return CoTTA(
        model,
        make_optimizer(params, cfg),
        ema_momentum=cfg.ema_momentum,
        restore_prob=cfg.restore_prob,
        ap_threshold=cfg.ap_threshold,
        num_augmentations=cfg.num_augmentations,
        augment=cfg.augment,
        seed=cfg.seed,
        **cfg.options(),
        **parts,
    )


register(
    MethodSpec(
        "cotta",
        _build_cotta,
        config=CoTTAConfig,
        datasets=DATASET_PRESETS["cotta"],
        summary="CoTTA: mean teacher, augmentation averaging, stochastic restore",
    )
)
