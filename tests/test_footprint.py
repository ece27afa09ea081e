"""The reading of ATen ops as reductions (grader.reductions) holds on every supported torch."""

import pytest
import torch

from grader import reductions


def _overloads():
    """Every ATen op registered: ``dir(torch.ops.aten)`` lists only those used so far."""
    for full_name in torch._C._dispatch_get_all_op_names():
        if full_name.startswith("aten::"):
            name, _, overload = full_name.removeprefix("aten::").partition(".")
            yield getattr(getattr(torch.ops.aten, name), overload or "default")


@pytest.mark.skipif(not hasattr(torch.Tag, "reduction"), reason="this torch tags no reductions")
def test_every_reduction_aten_tags_is_known_by_name_for_a_torch_without_the_tag():
    # torch 2.5 has no Tag.reduction: there the names alone must find every
    # reduction that a newer torch tags, or a whole-row sum would go unmeasured.
    missed = [
        str(func) for func in _overloads()
        if torch.Tag.reduction in func.tags
        and func._schema.name.removeprefix("aten::") not in reductions._REDUCTIONS
    ]
    assert missed == []


@pytest.mark.parametrize("op, args, width", [
    (torch.ops.aten.amax.default, (torch.zeros(4, 64), [-1]), 64),
    (torch.ops.aten.sum.dim_IntList, (torch.zeros(4, 64), [0]), 4),
    (torch.ops.aten.max.other, (torch.zeros(4, 64), torch.zeros(4, 64)), None),
    (torch.ops.aten.logsumexp.default, (torch.zeros(3, 5), [1]), 5),
])
def test_reductions_are_read_by_name_and_max_of_two_tensors_is_elementwise(op, args, width, monkeypatch):
    monkeypatch.setattr(reductions, "_REDUCTION_TAG", None)  # as on torch 2.5
    reductions._rule.cache_clear()
    try:
        found = reductions.reduced_width(op, args, {}, op(*args))
    finally:
        reductions._rule.cache_clear()
    assert (found[0] if found is not None else None) == width
