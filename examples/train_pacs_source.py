#!/usr/bin/env python
"""Train a PACS source model: ResNet-18 on one domain, the protocol of the paper (method.md §6).

ImageNet-pretrained torchvision ResNet-18 (``IMAGENET1K_V1``) with a new 7-class head, BatchNorm
statistics frozen (BatchNorm layers stay in eval mode, their affine parameters train), Adam with
learning rate 1e-4 and weight decay 5e-5, 40 epochs, batches of 32 (paper supplementary, after
SimATTA / DomainBed). As in DomainBed, 20% of the domain is held out to report validation accuracy
(``--holdout 0`` trains on all of it) and training images are augmented (random resized crop with
scale 0.7-1, horizontal flip, colour jitter 0.3, 10% grayscale; ``--no-augment`` to disable);
the paper does not state either detail. The weights of the final epoch are saved as a state dict
of the normalized model (:func:`eatta.models.backbones.resnet18` loads it with ``checkpoint=``),
with a JSON report next to it.

    python examples/train_pacs_source.py --root /data/PACS --source P --out ckpt/pacs_P.pt
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Subset

from eatta.console import exit_on_user_error


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("--root", required=True, help="PACS: <root>/<domain>/<class>/*")
    p.add_argument("--source", required=True, help="source domain: P, A, C, S or its name")
    p.add_argument("--out", required=True, help="where to save the weights (.pt)")
    p.add_argument("--epochs", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--weight-decay", type=float, default=5e-5)
    p.add_argument("--holdout", type=float, default=0.2, help="validation fraction (0: none)")
    p.add_argument("--no-augment", action="store_true")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument(
        "--random-init", action="store_true", help="start from random weights (smoke tests only)"
    )
    return p


def freeze_bn_statistics(model: nn.Module) -> None:
    """Put every BatchNorm layer in eval mode: running statistics neither used from the batch nor
    updated, affine parameters still trained."""
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.eval()


def _train_transform(size: int, augment: bool) -> Any:
    from eatta._compat import import_torchvision

    T = import_torchvision().transforms
    if not augment:
        return T.Compose([T.Resize((size, size)), T.ToTensor()])
    return T.Compose(
        [
            T.RandomResizedCrop(size, scale=(0.7, 1.0)),
            T.RandomHorizontalFlip(),
            T.ColorJitter(0.3, 0.3, 0.3, 0.3),
            T.RandomGrayscale(p=0.1),
            T.ToTensor(),
        ]
    )


@torch.no_grad()
def _accuracy(model: nn.Module, loader: DataLoader[Any], device: torch.device) -> float:
    model.eval()
    correct = total = 0
    for x, y in loader:
        pred = model(x.to(device)).argmax(1).cpu()
        correct += int((pred == y).sum())
        total += len(y)
    return correct / max(total, 1)


def main(argv: Sequence[str] | None = None) -> int:
    from eatta.data.pacs import PACS, ResizeTransform, pacs_domain
    from eatta.models.backbones import resnet18

    p = parser()
    args = p.parse_args(argv)
    if not 0.0 <= args.holdout < 1.0:
        p.error(f"--holdout must be in [0, 1), got {args.holdout}")
    device = torch.device(
        ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    )
    torch.manual_seed(args.seed)
    domain = pacs_domain(args.source)
    train_full = PACS(
        args.root, domain, transform=_train_transform(args.image_size, not args.no_augment)
    )
    eval_full = PACS(args.root, domain, transform=ResizeTransform(args.image_size))
    n = len(train_full)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(args.seed)).tolist()
    n_val = round(args.holdout * n)
    val_idx, train_idx = sorted(order[:n_val]), sorted(order[n_val:])
    g = torch.Generator().manual_seed(args.seed)
    train_loader = DataLoader(
        Subset(train_full, train_idx),
        batch_size=args.batch_size,
        shuffle=True,
        generator=g,
        num_workers=args.workers,
        drop_last=len(train_idx) > args.batch_size,
    )
    val_loader = DataLoader(Subset(eval_full, val_idx), batch_size=64, num_workers=args.workers)

    model = resnet18(num_classes=7, pretrained=not args.random_init).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    start = time.perf_counter()
    history = []
    for epoch in range(args.epochs):
        model.train()
        freeze_bn_statistics(model)
        total_loss, seen = 0.0, 0
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total_loss += float(loss.detach()) * len(y)
            seen += len(y)
        val = _accuracy(model, val_loader, device) if val_idx else None
        history.append({"epoch": epoch + 1, "loss": total_loss / max(seen, 1), "val_acc": val})
        shown = "" if val is None else f", validation accuracy {100 * val:.1f}%"
        print(
            f"epoch {epoch + 1}/{args.epochs}: loss {total_loss / max(seen, 1):.4f}{shown}",
            flush=True,
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    model.eval()
    torch.save(model.cpu().state_dict(), out)
    report = {
        "source": domain,
        "images": n,
        "train_images": len(train_idx),
        "val_images": len(val_idx),
        "val_acc": history[-1]["val_acc"] if history else None,
        "seconds": time.perf_counter() - start,
        "args": vars(args),
        "history": history,
    }
    out.with_suffix(".json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    print(f"saved {out} ({len(train_idx)} training images of {domain})")
    return 0


if __name__ == "__main__":  # a missing dataset or weights: one line, exit status 2
    sys.exit(exit_on_user_error("train_pacs_source.py", main))
