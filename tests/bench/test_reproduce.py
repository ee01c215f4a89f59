"""The reproduction scripts, end to end on miniature ImageNet-C and PACS folders."""

from __future__ import annotations

import json
import re

import pytest
import torch
from bench_fixtures import (
    assert_png,
    load_example,
    make_imagenet_c,
    make_pacs,
    one_thread,  # noqa: F401  (autouse fixture)
)

import eatta.bench.reproduce as reproduce
from eatta.bench import cli
from eatta.data.imagenet import imagenet_wnids
from eatta.models.backbones import resnet18

# small models adapt on small batches here on purpose: fast, exact checks (SmallBatchWarning off)
pytestmark = pytest.mark.small_batches

FAST = [
    "--random-init",
    "--batch-size",
    "4",
    "--limit",
    "4",
    "--device",
    "cpu",
    "--workers",
    "0",
    "--no-progress",
]


@pytest.fixture(scope="module")
def inc_root(tmp_path_factory):
    return make_imagenet_c(tmp_path_factory.mktemp("inc"), imagenet_wnids()[:3], per_class=2)


@pytest.fixture(scope="module")
def pacs_root(tmp_path_factory):
    return make_pacs(tmp_path_factory.mktemp("pacs"))


@pytest.fixture(scope="module")
def imagenet_c():
    return load_example("reproduce_imagenet_c")


@pytest.fixture(scope="module")
def pacs():
    return load_example("reproduce_pacs")


def results(out) -> list[dict]:
    return json.loads((out / "results.json").read_text())["results"]


def test_imagenet_c_rows_are_the_published_table(imagenet_c):
    rows = {r.label: r for r in imagenet_c.ROWS}
    assert rows["Source"].published == {"ctta": 82.0, "ftta": 82.0}
    assert rows["EATTA*"].published == {"ctta": 53.8, "ftta": 52.4}
    assert rows["EATTA† (BFS=300)"].labels == 3 and rows["EATTA† (BFS=300)"].buffer == 300
    assert rows["CEMA (BFS=300)"].published == {"ftta": 52.9}
    assert rows["HILTTA†"].method == "hiltta" and rows["HILTTA†"].labels == 3
    assert len(rows) == 12


def test_reproduce_imagenet_c_end_to_end(tmp_path, capsys, inc_root, imagenet_c):
    out = tmp_path / "out"
    argv = [
        "--root",
        str(inc_root),
        "--backbone",
        "resnet18",
        "--rows",
        "source,tent,baseline,eatta",
        "--out",
        str(out),
        *FAST,
    ]
    assert imagenet_c.main(argv) == 0
    text = capsys.readouterr().out
    assert "82.0 / " in text and "53.8 / " in text and "50.7 / " in text
    measured = re.findall(r"\| EATTA\* \| C \| imagenet-c \| 53\.8 / (\d+\.\d) \|", text)
    doc = results(out)
    eatta1 = next(r for r in doc if r["key"] == "imagenet-c/eatta/ctta/k1-n1")
    assert measured == [f"{eatta1['average_error']:.1f}"]
    keys = [r["key"] for r in doc]
    assert "imagenet-c/source/-/k0-n1" in keys and "imagenet-c/eatta/ftta/k3-n1-bfs300" in keys
    assert len(keys) == 1 + 2 * (1 + 1 + 3)  # source once; tent, baseline, 3 EATTA rows per setting
    assert eatta1["labels_used"] == 15 and eatta1["images"] == 60
    assert all(len(r["domain_errors"]) == 15 for r in doc)
    csv_head = (out / "results.csv").read_text().splitlines()[0]
    assert "err:gaussian_noise" in csv_head and "err:jpeg_compression" in csv_head
    assert_png(out / "online_error.png")


def test_reproduce_imagenet_c_resumes_and_shards_merge(
    tmp_path, capsys, inc_root, imagenet_c, monkeypatch
):
    argv = [
        "--root",
        str(inc_root),
        "--backbone",
        "resnet18",
        "--rows",
        "eatta,tent",
        "--setting",
        "ftta",
        "--checkpoint-every",
        "4",
        "--no-plot",
        *FAST,
    ]
    assert imagenet_c.main([*argv, "--out", str(tmp_path / "full")]) == 0
    full = results(tmp_path / "full")

    real = reproduce.run_grid

    class Stop(Exception):
        pass

    def interrupted(*args, **kwargs):
        def stop(t, info):
            if t == 9:
                raise Stop

        kwargs["callback"] = stop
        return real(*args, **kwargs)

    monkeypatch.setattr(reproduce, "run_grid", interrupted)
    with pytest.raises(Stop):
        imagenet_c.main([*argv, "--out", str(tmp_path / "cut")])
    monkeypatch.setattr(reproduce, "run_grid", real)
    assert imagenet_c.main([*argv, "--out", str(tmp_path / "cut")]) == 0
    resumed = results(tmp_path / "cut")
    assert [(r["key"], r["online"], r["model_digest"]) for r in resumed] == [
        (r["key"], r["online"], r["model_digest"]) for r in full
    ]
    assert resumed[0]["sessions"] == 2

    for i in range(2):
        assert imagenet_c.main([*argv, "--shard", f"{i}/2", "--out", str(tmp_path / f"s{i}")]) == 0
    capsys.readouterr()
    dirs = [str(tmp_path / "s0"), str(tmp_path / "s1")]
    assert cli.main(["merge", *dirs, "--out", str(tmp_path / "merged"), "--no-plot"]) == 0
    merged = results(tmp_path / "merged")
    assert [(r["key"], r["domain_errors"], r["model_digest"]) for r in merged] == [
        (r["key"], r["domain_errors"], r["model_digest"]) for r in full
    ]


def test_train_pacs_source_freezes_batchnorm_statistics(tmp_path, pacs_root):
    train = load_example("train_pacs_source")
    ckpt = tmp_path / "pacs_P.pt"
    argv = [
        "--root",
        str(pacs_root),
        "--source",
        "P",
        "--out",
        str(ckpt),
        "--epochs",
        "2",
        "--batch-size",
        "4",
        "--random-init",
        "--image-size",
        "32",
        "--workers",
        "0",
        "--device",
        "cpu",
    ]
    assert train.main(argv) == 0
    report = json.loads(ckpt.with_suffix(".json").read_text())
    assert report["source"] == "photo" and report["val_images"] == 3  # 20% of 14 images
    assert len(report["history"]) == 2 and report["args"]["lr"] == 1e-4
    assert report["args"]["weight_decay"] == 5e-5
    trained = resnet18(num_classes=7, checkpoint=ckpt)
    fresh = resnet18(num_classes=7, pretrained=False)
    bn, bn0 = trained.model.bn1, fresh.model.bn1
    assert torch.equal(bn.running_mean, bn0.running_mean)  # statistics frozen ...
    assert torch.equal(bn.running_var, bn0.running_var)
    assert not torch.equal(bn.weight, bn0.weight)  # ... affine parameters trained
    assert not torch.equal(trained.model.fc.weight, fresh.model.fc.weight)


def test_reproduce_pacs_end_to_end(tmp_path, capsys, pacs_root, pacs):
    train = load_example("train_pacs_source")
    for src in ("P", "S"):
        assert (
            train.main(
                [
                    "--root",
                    str(pacs_root),
                    "--source",
                    src,
                    "--out",
                    str(tmp_path / f"pacs_{src}.pt"),
                    "--epochs",
                    "1",
                    "--random-init",
                    "--image-size",
                    "32",
                    "--workers",
                    "0",
                    "--device",
                    "cpu",
                ]
            )
            == 0
        )
    capsys.readouterr()
    out = tmp_path / "out"
    argv = [
        "--root",
        str(pacs_root),
        "--sequence",
        "P-A-C-S,S-C-P-A",
        "--checkpoint",
        str(tmp_path / "pacs_{source}.pt"),
        "--rows",
        "source,eatta",
        "--image-size",
        "32",
        "--out",
        str(out),
        *FAST,
    ]
    assert pacs.main(argv) == 0
    text = capsys.readouterr().out
    assert "47.5 / " in text and "57.4 / " in text  # Source averages, P-A-C-S and S-C-P-A
    assert "| EATTA* | C | pacs:P-A-C-S | 74.9 / " in text
    doc = results(out)
    keys = {r["key"] for r in doc}
    assert "pacs:P-A-C-S/eatta/ftta/k3-n1-bfs300" in keys and "pacs:S-C-P-A/source/-/k0-n1" in keys
    src = next(r for r in doc if r["key"] == "pacs:P-A-C-S/source/-/k0-n1")
    assert src["domains"] == ["art_painting", "cartoon", "sketch"]
    row = re.search(r"\| Source \| C \| pacs:P-A-C-S \| (.*) \|", text).group(1).split(" | ")
    accs = [float(c.split(" / ")[1]) for c in row]
    assert accs == pytest.approx(
        [round(100 - e, 1) for e in src["domain_errors"]] + [round(100 - src["average_error"], 1)],
        abs=0.051,
    )
    assert_png(out / "online_error.png")


def test_pacs_published_numbers_match_the_paper(pacs):
    rows = {r.label: r for r in pacs.ROWS}
    assert rows["EATTA† (BFS=300)"].published["ctta"]["S-C-P-A"] == (79.7, 87.5, 79.9, 82.4)
    assert rows["TENT"].published["ftta"]["A-C-P-S"] == (73.5, 94.9, 68.3, 78.9)
    assert rows["Source"].published["ctta"]["P-A-C-S"] == (66.3, 32.8, 43.4, 47.5)
    with pytest.raises(SystemExit):
        pacs.main(["--root", ".", "--sequence", "P-C-A-S"])


def test_reference_preset_runs_two_labelled_steps_per_batch(tmp_path, capsys, inc_root, imagenet_c):
    out = tmp_path / "ref"
    argv = [
        "--root",
        str(inc_root),
        "--backbone",
        "resnet18",
        "--rows",
        "eatta",
        "--setting",
        "ctta",
        "--preset",
        "reference",
        "--no-plot",
        "--out",
        str(out),
        *FAST,
    ]
    assert imagenet_c.main(argv) == 0
    first = next(r for r in results(out) if r["key"] == "imagenet-c/eatta/ctta/k1-n1")
    assert first["labels_used"] == 2 * 15  # two optimization steps, each re-selecting
    assert first["hparams"]["preset"] == "reference"
    assert first["label"] == "eatta reference (2/batch)"
    assert "eatta reference (2/batch)" in capsys.readouterr().out
