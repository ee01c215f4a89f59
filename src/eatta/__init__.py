"""eatta: effortless active test-time adaptation for any PyTorch classifier.

Wrap a model in two lines::

    params = eatta.configure(model)
    adapted = eatta.EATTA(model, torch.optim.SGD(params, lr=2.5e-4, momentum=0.9), oracle=ask)
    logits = adapted(x)  # predicts, asks for at most one label, adapts in place

or build any registered method by name with the paper's per-dataset hyperparameters::

    method = eatta.create("tent", model, dataset="imagenet-c")
    eatta.available()  # the names; eatta.describe("tent") lists its keys and defaults
"""

from eatta.annotate.oracle import ABSTAIN, GroundTruthOracle, ModelOracle, OracleError
from eatta.budget import Budget
from eatta.buffer import LabelBuffer
from eatta.configure import collect_params, configure, configure_model
from eatta.debias import GradNormDebiaser
from eatta.history import LastKClasses, NoClassBalance, ReferenceClassHistory
from eatta.methods import EATTA, AdaptiveMethod, InvalidInputError
from eatta.methods.registry import available, create, describe
from eatta.noise import GaussianNoise, RecordedNoise
from eatta.normalization import MixedBatchNorm, set_mix_weight, use_mixed_norm
from eatta.selection import PerturbationSelector
from eatta.split import ModelSplit, SplitNotFoundError, split_model
from eatta.window import SampleWindow, SmallBatchWarning

__version__ = "0.1.0"

__all__ = [
    "ABSTAIN",
    "EATTA",
    "AdaptiveMethod",
    "Budget",
    "GaussianNoise",
    "GradNormDebiaser",
    "GroundTruthOracle",
    "InvalidInputError",
    "LabelBuffer",
    "LastKClasses",
    "MixedBatchNorm",
    "ModelOracle",
    "ModelSplit",
    "NoClassBalance",
    "OracleError",
    "PerturbationSelector",
    "RecordedNoise",
    "ReferenceClassHistory",
    "SampleWindow",
    "SmallBatchWarning",
    "SplitNotFoundError",
    "__version__",
    "available",
    "collect_params",
    "configure",
    "configure_model",
    "create",
    "describe",
    "set_mix_weight",
    "split_model",
    "use_mixed_norm",
]
