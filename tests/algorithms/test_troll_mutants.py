"""TROLL's objective refuses each solver and storage option outside its config field's rule, by name.

``troll_objective`` checks its arguments with the rules of the config schema (``TrollObjective`` in
runners/algorithms/components.py); mutation testing showed that dropping any one option from that check went
unnoticed. Each case passes one value just outside the rule written here from the schema's comments (the
dual solver of TROLL, arXiv 2510.03817, Listing 3: at least 2 interior points, at least 1 step, a positive
stop width and eta range; a default probability in (0, 1e-3); at least one token per chunk), on a batch the
objective accepts with the defaults, and expects the ValueError to name that option.
"""

from __future__ import annotations

import pytest
import torch

from runners.algorithms.troll import troll_objective
from tests.algorithms.test_troll import _inputs, _sparse_batch

OUTSIDE = [
    ("p_default", 0.0),
    ("p_default", 1e-3),
    ("chunk_size", 0),
    ("num_points", 1),
    ("max_steps", 0),
    ("tol", 0.0),
    ("eta_min", 0.0),
    ("eps", 0.0),
    ("alpha", -0.1),
]


def _batch():
    _, new_logits, responses, index, logp = _sparse_batch()
    return _inputs(new_logits, index, logp, responses)


def test_the_batch_is_accepted_with_the_defaults():
    out = troll_objective(_batch())
    assert torch.isfinite(out.loss_mat).all()


@pytest.mark.parametrize(("key", "value"), OUTSIDE)
def test_an_option_outside_its_rule_is_refused_by_name(key, value):
    with pytest.raises(ValueError, match=rf"^objective 'troll': {key} .*\(got {value!r}\)$"):
        troll_objective(_batch(), **{key: value})
