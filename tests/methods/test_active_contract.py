"""The contract every active baseline keeps, checked for each (shared checks, one maker each)."""

from __future__ import annotations

import pytest
from _active_method_checks import (
    BAD_INPUTS,
    BAD_ORACLES,
    check_bad_input,
    check_bad_oracle,
    check_budget,
    check_only_optimizer_params_change,
    check_reset_is_exact,
    check_state_dict_round_trip,
)
from test_baseline import make as make_baseline
from test_cema import make as make_cema
from test_simatta import make as make_simatta

# small models adapt on small batches here on purpose: fast, exact checks (SmallBatchWarning off)
pytestmark = pytest.mark.small_batches

MAKERS = {"baseline": make_baseline, "cema": make_cema, "simatta": make_simatta}
methods = pytest.mark.parametrize("method", sorted(MAKERS))


@methods
def test_only_optimizer_params_change(method):
    check_only_optimizer_params_change(MAKERS[method])


@methods
def test_reset_is_exact(method):
    check_reset_is_exact(MAKERS[method])


@methods
def test_state_dict_round_trip(method, tmp_path):
    check_state_dict_round_trip(MAKERS[method], tmp_path)


@methods
def test_budget_every_other_batch(method):
    check_budget(MAKERS[method])


@methods
@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input(method, case):
    check_bad_input(MAKERS[method], case)


@methods
@pytest.mark.parametrize("case", sorted(BAD_ORACLES))
def test_bad_oracle(method, case):
    check_bad_oracle(MAKERS[method], case)
