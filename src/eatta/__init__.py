"""eatta: effortless active test-time adaptation for any PyTorch classifier.

Wrap a model in two lines::

    params = eatta.configure(model)
    adapted = eatta.EATTA(model, torch.optim.SGD(params, lr=2.5e-4, momentum=0.9), oracle=ask)
    logits = adapted(x)  # predicts, asks for at most one label, adapts in place

or build any registered method by name with the paper's per-dataset hyperparameters::

    method = eatta.create("tent", model, dataset="imagenet-c")
    eatta.available()  # the names; eatta.describe("tent") lists its keys and defaults

The parts live in their subpackages: :mod:`eatta.annotate` (who answers), :mod:`eatta.selection`,
:mod:`eatta.balance`, :mod:`eatta.debias`, :mod:`eatta.buffer`,
:mod:`eatta.normalization`, :mod:`eatta.window`, :mod:`eatta.split`, :mod:`eatta.methods`.
"""

from eatta.annotate.oracle import ABSTAIN, GroundTruthOracle, OracleError
from eatta.budget import Budget
from eatta.configure import configure
from eatta.methods import EATTA, AdaptiveMethod, InvalidInputError
from eatta.methods.registry import available, create, describe
from eatta.outputs import OutputError
from eatta.split import SplitNotFoundError, split_model
from eatta.window import SmallBatchWarning

__version__ = "0.1.0"

__all__ = [
    "ABSTAIN",
    "EATTA",
    "AdaptiveMethod",
    "Budget",
    "GroundTruthOracle",
    "InvalidInputError",
    "OracleError",
    "OutputError",
    "SmallBatchWarning",
    "SplitNotFoundError",
    "__version__",
    "available",
    "configure",
    "create",
    "describe",
    "split_model",
]
