"""The torchvision import workaround: handled once, other errors not hidden."""

from __future__ import annotations

import subprocess
import sys
import textwrap


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
