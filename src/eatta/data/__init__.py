"""Benchmark data: ImageNet-C/R/Sketch/A, PACS, digits-C (and its CCC-style stream), MNIST
rendered as scikit-learn's digits, the deployed stream (clean digits with corrupted stretches),
and seeded CTTA test streams (paper §6).

Datasets check their folder layout when built and raise :class:`DatasetLayoutError` (a
``ValueError``) naming the expected pattern and what was found. Images are decoded with PIL and
returned as float tensors in ``[0, 1]``; input normalization belongs to the model wrapper
(:class:`eatta.models.backbones.Normalized`).
"""

from __future__ import annotations

from eatta.data._layout import DatasetLayoutError, FolderDataset
from eatta.data.ccc import CCC_SPEEDS, CCCStream, CCCWalk, ccc_images, ccc_walk, digits_ccc
from eatta.data.deployed import deployed_domains
from eatta.data.digits import (
    DIGITS_C_CORRUPTIONS,
    DIGITS_C_VERSION,
    digits_c,
    digits_c_cache_dir,
    digits_c_domains,
    digits_source,
    digits_split,
    digits_test,
)
from eatta.data.imagenet import (
    CORRUPTIONS,
    EvalTransform,
    ImageNetA,
    ImageNetC,
    ImageNetR,
    ImageNetSketch,
    SubsetLogits,
    class_indices,
    imagenet_a_wnids,
    imagenet_c_domains,
    imagenet_r_wnids,
    imagenet_wnids,
    select_logits,
    select_subset,
)
from eatta.data.mnist import mnist_digits, render_like_sklearn_digits
from eatta.data.pacs import (
    PACS,
    PACS_CLASSES,
    PACS_DOMAINS,
    PACS_LETTERS,
    PACS_SEQUENCES,
    ResizeTransform,
    pacs_domain,
    pacs_domains,
    parse_pacs_sequence,
)
from eatta.data.stream import MIXED, Domain, TestStream

__all__ = [
    "CCC_SPEEDS",
    "CORRUPTIONS",
    "DIGITS_C_CORRUPTIONS",
    "DIGITS_C_VERSION",
    "MIXED",
    "PACS",
    "PACS_CLASSES",
    "PACS_DOMAINS",
    "PACS_LETTERS",
    "PACS_SEQUENCES",
    "CCCStream",
    "CCCWalk",
    "DatasetLayoutError",
    "Domain",
    "EvalTransform",
    "FolderDataset",
    "ImageNetA",
    "ImageNetC",
    "ImageNetR",
    "ImageNetSketch",
    "ResizeTransform",
    "SubsetLogits",
    "TestStream",
    "ccc_images",
    "ccc_walk",
    "class_indices",
    "deployed_domains",
    "digits_c",
    "digits_c_cache_dir",
    "digits_c_domains",
    "digits_ccc",
    "digits_source",
    "digits_split",
    "digits_test",
    "imagenet_a_wnids",
    "imagenet_c_domains",
    "imagenet_r_wnids",
    "imagenet_wnids",
    "mnist_digits",
    "pacs_domain",
    "pacs_domains",
    "parse_pacs_sequence",
    "render_like_sklearn_digits",
    "select_logits",
    "select_subset",
]
