"""The checks against the numpy reference: a near tie is accepted, a wrong token is named."""

from __future__ import annotations

import numpy as np

from gpud.testing.reference import greedy_mismatch


def test_a_token_off_the_reference_argmax_is_named() -> None:
    logits = [np.array([0.0, 1.0, 0.5]), np.array([2.0, 2.0001, -1.0])]
    assert greedy_mismatch([1, 0], logits) == ""  # step 1 ties within LOGIT_TOL
    assert "token 0: 2 where the reference's argmax is 1" in greedy_mismatch([2, 1], logits)
