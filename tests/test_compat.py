"""The torchvision import workaround: handled once, other errors not hidden."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True
    )


def test_import_torchvision_and_timm_work_and_warn_at_most_once():
    out = run(
        """
        import warnings
        warnings.simplefilter("always")
        from eatta._compat import import_timm, import_torchvision, TorchvisionOpsWarning
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            tv = import_torchvision(); import_torchvision(); timm = import_timm()
        print(len([x for x in w if issubclass(x.category, TorchvisionOpsWarning)]))
        print(type(tv.models.resnet18()).__name__, type(timm.create_model("resnet18")).__name__)
        """
    )
    assert out.returncode == 0, out.stderr
    count, names = out.stdout.splitlines()[:2]
    assert int(count) <= 1
    assert names == "ResNet ResNet"


def test_other_import_errors_are_not_hidden():
    out = run(
        """
        import sys
        sys.modules["torchvision"] = None  # import of it raises ImportError
        from eatta._compat import import_torchvision
        try:
            import_torchvision()
        except ImportError as e:
            print("ImportError")
        """
    )
    assert out.stdout.strip() == "ImportError", out.stderr


INSTALL = Path(__file__).resolve().parents[1] / "docs" / "start" / "install.md"


def test_user_code_imports_torchvision_and_timm_after_eatta_compat():
    """The README's install, then user code as docs/start/install.md writes it: the public call
    first, then the plain imports (in a fresh interpreter)."""
    out = run(
        """
        from eatta.compat import import_timm

        import_timm()
        import timm
        import torchvision

        tv, tm = torchvision.models.resnet18(), timm.create_model("resnet18")
        print(type(tv).__name__, type(tm).__name__)
        """
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ResNet", "ResNet"]


def test_what_install_md_says_of_a_plain_import_is_true():
    """A plain ``import torchvision`` works (a CPU torchvision) or fails as the page says."""
    page = " ".join(INSTALL.read_text(encoding="utf-8").split())
    quoted = "fails with `operator torchvision::nms does not exist`"
    assert quoted in page and "`eatta.compat.import_torchvision()`" in page
    out = run("import torchvision")
    if out.returncode != 0:
        assert "operator torchvision::nms does not exist" in out.stderr.splitlines()[-1]


def test_user_code_imports_transformers_after_eatta_compat():
    """Hugging Face vision models import torchvision: after the public call, they import and
    build as docs/guide/huggingface.md writes it (a fresh interpreter, no download)."""
    out = run(
        """
        from eatta.compat import import_transformers

        import_transformers()
        from transformers import ViTConfig, ViTForImageClassification

        model = ViTForImageClassification(ViTConfig(image_size=32, patch_size=8, hidden_size=16,
            num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, num_labels=3))
        print(type(model).__name__)
        """
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ViTForImageClassification"]


def test_what_install_md_says_of_transformers_is_true():
    """A plain ``from transformers import ViTForImageClassification`` works (a CPU torchvision)
    or fails as the page says, and the page names the call that makes it work."""
    page = " ".join(INSTALL.read_text(encoding="utf-8").split())
    assert "`eatta.compat.import_transformers()`" in page
    assert "Could not import module 'ViTForImageClassification'" in page
    out = run("from transformers import ViTForImageClassification")
    if out.returncode != 0:
        assert "Could not import module 'ViTForImageClassification'" in out.stderr
