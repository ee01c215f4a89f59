"""``eatta-bench --dataset digits-deployed``: the deployed stream (:mod:`eatta.data.deployed`) run
end to end through the command line, in order and mixed within batches, on a tiny version."""

from __future__ import annotations

import json

import pytest
from bench_fixtures import one_thread  # noqa: F401  (autouse fixture)

from eatta.bench import suites
from eatta.data.deployed import CLEAN, DEPLOYED_CORRUPTIONS

SEGMENTS = 19


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


def test_the_deployed_stream_is_registered_with_its_severity():
    assert "digits-deployed" in suites.DATASETS and "digits-deployed" in suites.LAYOUTS
    assert suites.check_severity("digits-deployed", None) == 2
    assert suites.check_severity("digits-deployed", 4) == 4


@pytest.mark.parametrize("mixed", [False, True])
def test_the_deployed_stream_runs_in_order_and_mixed(cache, tmp_path, capsys, mixed):
    import eatta.bench.cli as cli

    out = tmp_path / "run"
    argv = ["--dataset", "digits-deployed", "--methods", "source,tent", "--limit", "8"]
    argv += ["--batch-size", "4", "--no-progress", "--no-plot", "--cache-dir", str(cache)]
    assert cli.main([*argv, *(["--mixed"] if mixed else []), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    title = text[text.index("**digits-deployed**") :].splitlines()[0]
    head = f"**digits-deployed**: error % (lower is better), {8 * SEGMENTS} images"
    assert title.startswith(head)
    assert "severity 2" in title and ("mixed domains" in title) == mixed
    assert "| clean |" in text and "| Worse |" in text
    doc = json.loads((out / "results.json").read_text())
    source, tent = doc["results"]
    names = [CLEAN] * 3
    for c in DEPLOYED_CORRUPTIONS:
        names += [c] + [CLEAN] * 3
    assert source["domains"] == names == tent["domains"]
    assert source["domain_images"] == [8] * SEGMENTS
    # equal segments: the mean of the per-segment errors is the stream's overall error
    for r in (source, tent):
        assert r["average_error"] == pytest.approx(r["overall_error"])
    assert len(tent["online"]) == 2 * SEGMENTS
    assert tent["protocol"]["mixed"] is mixed and tent["protocol"]["severity"] == 2


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--gradual"], "gradual needs severities; digits-deployed has none"),
        (["--ccc", "slow"], "built for digits-c, not digits-deployed"),
    ],
)
def test_the_deployed_stream_refuses_what_it_has_not(tmp_path, capsys, extra, message):
    import eatta.bench.cli as cli

    out = tmp_path / "run"
    argv = ["--dataset", "digits-deployed", "--no-progress", *extra, "--out", str(out)]
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err
    assert not (out / "cells").exists()


def test_the_deployed_stream_serves_the_vit_under_its_own_name(cache):
    from eatta.models import digits_vit as dv
    from eatta.models.digits_cnn import state_digest

    b = suites.deployed_benchmark(cache, backbone="digits-vit")
    assert b.name == "digits-deployed:vit" and b.defaults_key == "digits-c"
    assert isinstance(b.model_fn(), dv.DigitsViT)
    assert b.provenance["model_sha256"] == state_digest(b.model_fn()) == dv.DIGITS_VIT_SHA256
    assert suites.deployed_benchmark(cache).name == "digits-deployed"
    with pytest.raises(ValueError, match="digits-deployed has no backbone 'resnet18'"):
        suites.deployed_benchmark(cache, backbone="resnet18")
