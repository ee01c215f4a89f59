"""Quick start: adapt a small digits CNN to corrupted digits with one label per batch.

The packaged BatchNorm CNN (trained on clean scikit-learn digits; the source model of
``eatta-bench``) serves a stream of corrupted test digits (ImageNet-C corruptions at severity 5,
one after another). EATTA adapts it online, asking a simulated annotator for at most one label
per batch of 64.

    python examples/quickstart.py
"""

from __future__ import annotations

import argparse
import copy
import sys
import time

import torch

import eatta
from eatta.console import exit_on_user_error
from eatta.data import DIGITS_C_CORRUPTIONS, TestStream, digits_c_domains
from eatta.models.digits_cnn import packaged_digits_source

CORRUPTIONS = ("gaussian_noise", "defocus_blur", "snow", "fog", "contrast", "elastic_transform")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--corruptions",
        nargs="+",
        default=list(CORRUPTIONS),
        choices=DIGITS_C_CORRUPTIONS,
        metavar="NAME",
        help="digits-C corruptions, in order",
    )
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # a 24k-parameter network runs fastest on one thread
    start = time.perf_counter()

    source, report = packaged_digits_source()
    print(f"source model: clean test accuracy {100 * report['clean_test_accuracy']:.1f}%")
    domains = digits_c_domains(args.corruptions)
    stream = TestStream(domains, batch_size=args.batch_size, seed=args.seed)

    # wrap the model (README: "Wrap your own model")
    model = copy.deepcopy(source)
    params = eatta.configure(model)
    oracle = eatta.GroundTruthOracle()
    optimizer = torch.optim.SGD(params, lr=5e-3, momentum=0.9)
    adapted = eatta.EATTA(model, optimizer, oracle=oracle, budget=1)

    errors: dict[str, list[int]] = {}
    for x, y, domain in stream:
        with torch.no_grad():
            src_wrong = int((source(x).argmax(1) != y).sum())
        oracle.set_labels(y)  # the simulated annotator; it reveals only what EATTA asks for
        eatta_wrong = int((adapted(x).argmax(1) != y).sum())
        tally = errors.setdefault(domain, [0, 0, 0])
        tally[0] += src_wrong
        tally[1] += eatta_wrong
        tally[2] += len(y)

    print(f"\n{'corruption':<20}{'source err %':>14}{'EATTA err %':>14}")
    for domain, (s, e, n) in errors.items():
        print(f"{domain:<20}{100 * s / n:>14.1f}{100 * e / n:>14.1f}")
    s, e, n = (sum(v[i] for v in errors.values()) for i in range(3))
    print(f"{'average':<20}{100 * s / n:>14.1f}{100 * e / n:>14.1f}")
    print(
        f"\nlabels used: {adapted.labels_used} of {n} images "
        f"({len(stream)} batches); {time.perf_counter() - start:.1f} s"
    )


if __name__ == "__main__":  # a user's mistake: one line, exit status 2
    sys.exit(exit_on_user_error("quickstart.py", main))
