"""A built-in kernel's rule is checked once per distinct call (its tensors' geometry and scalars), not
once per dispatch: an eager forward makes new tensors of the same shapes every time (issue #17)."""

from __future__ import annotations

from typing import Any

import pytest

from gpud.backends.base import Program
from gpud.session.kernels import KernelRef
from gpud_protocol import KernelOptions
from gpud_protocol.errors import InvalidArgument
from gpud_protocol.ops import KERNELS, KernelSpec, TensorInfo


def argmax() -> KernelRef:
    program = Program(("k",), "argmax_f32", None, None, None, None)
    return KernelRef(1, "gpud:argmax_f32", "argmax_f32", KernelOptions(), program, {0: program}, KERNELS["argmax_f32"])


def test_the_rule_runs_once_per_distinct_call(monkeypatch: pytest.MonkeyPatch) -> None:
    checked: list[Any] = []
    verify = KernelSpec.verify

    def counted(spec: KernelSpec, tensors: Any, scalars: Any) -> None:
        checked.append((tuple(tensors), tuple(scalars)))
        verify(spec, tensors, scalars)

    monkeypatch.setattr(KernelSpec, "verify", counted)
    kernel = argmax()
    infos, scalars = [TensorInfo("float32", (4, 8)), TensorInfo("int32", (4,))], [4, 8]
    for _ in range(3):  # new tensors each time, the same geometry: one check
        kernel.check_op(infos, list(scalars))
    assert len(checked) == 1
    kernel.check_op([TensorInfo("float32", (2, 8)), TensorInfo("int32", (2,))], [2, 8])
    assert len(checked) == 2
    bad = [TensorInfo("float32", (4, 8)), TensorInfo("float32", (4,))]  # argmax writes int32
    for _ in range(2):  # a call that breaks the rule is refused every time, never kept
        with pytest.raises(InvalidArgument, match="argmax"):
            kernel.check_op(bad, [4, 8])
    assert len(checked) == 4
