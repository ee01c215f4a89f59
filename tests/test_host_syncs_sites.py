"""The host-sync counter names a site inside the package whatever the checkout's folder is named
(a clone is a folder named ``eatta``: its tests' frames are not the package's)."""

from __future__ import annotations

import torch

import eatta.methods.base
from _host_syncs import counting


def test_a_frame_in_a_folder_named_eatta_outside_the_package_is_no_site(tmp_path):
    probe = tmp_path / "eatta" / "tests" / "probe.py"  # as in a clone: <somewhere>/eatta/tests
    code = compile("def read(t):\n    return t.item()\n", str(probe), "exec")
    ns: dict[str, object] = {}
    exec(code, ns)
    device = torch.ones(())
    with counting([device]) as syncs:
        ns["read"](device)  # type: ignore[operator]
    assert dict(syncs.sites) == {("item", "?"): 1}


def test_a_frame_in_the_package_is_named_relative_to_it():
    device = torch.ones(3)
    with counting([device]) as syncs:
        eatta.methods.base.is_finite(device)  # on the CPU it reads the extremes with item()
    sites = {site for _, site in syncs.sites}
    assert sites and all(s.startswith("methods/base.py:") for s in sites), sites
