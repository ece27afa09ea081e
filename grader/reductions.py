"""How many entries one result of an ATen op combines (``reduced_width``):
the rules by which ``footprint.Measure``, in the worker, reads every op of a
memory-efficient exercise's call as a reduction of some width, or none.
"""

from __future__ import annotations

import functools
import math
import re

import torch
from torch.utils._python_dispatch import _disable_current_modes

# Most reductions say so themselves: ATen tags them (``Tag.reduction``: sum, amax, mean,
# logsumexp, var_mean, all, count_nonzero...) and their ``dim`` argument says over what.
# Others are told by their schema: a ``kernel_size`` (pooling), a ``weight`` with a
# ``stride`` and a ``padding`` (convolution), a ``normalized_shape`` (layer norm), a loss's
# ``reduction``. The tables below list only what neither tells: matrix products, scans,
# sorts, softmaxes, solvers, and the ops whose width depends on their data (a scatter that
# adds many entries into one place). Every other op combines nothing: elementwise ops
# (``Tag.pointwise``), views, copies, ``cat``, indexing, ``gather``, ``index_select``.

# Ops that read a whole dimension (their ``dim`` argument; every entry without one) but
# carry no reduction tag: scans, sorts and selections by rank, softmaxes, norms.
_ALONG_DIM = frozenset({
    "cumsum", "cumprod", "cummax", "cummin", "_cummax_helper", "_cummin_helper", "logcumsumexp",
    "_logcumsumexp", "sort", "topk", "kthvalue", "median", "nanmedian", "mode",
    "softmax", "log_softmax", "_softmax", "_log_softmax", "_safe_softmax", "_masked_softmax",
    "_softmax_backward_data", "_log_softmax_backward_data", "_sparse_softmax", "_sparse_log_softmax",
    "_sparse_sum", "_sparse_csr_sum", "_sparse_csr_prod", "native_norm", "_aminmax", "hash_tensor",
})
# Ops that compare every entry with every other: finding the distinct values.
_WHOLE_TENSOR = frozenset({"_unique", "_unique2", "unique_dim", "unique_consecutive",
                           "unique_dim_consecutive"})
# The reductions ATen tags (``Tag.reduction``), by name: torch 2.5 has no such tag, and
# the tag leaves out some ``out=`` overloads. An overload with an ``other`` tensor
# (``max(a, b)``) is elementwise.
_REDUCTION_TAG = getattr(torch.Tag, "reduction", None)
_REDUCTIONS = frozenset({
    "all", "amax", "amin", "aminmax", "any", "argmax", "argmin", "count_nonzero", "linalg__powsum",
    "linalg_vector_norm", "logsumexp", "max", "mean", "min", "nansum", "norm", "prod", "std", "std_mean",
    "sum", "var", "var_mean",
})
# Matrix products and distances, ``name: (operand, axes)``: one result entry sums over
# these axes of that operand (``addmm(bias, a, b)`` over a's last; ``addbmm`` over the
# batch too).
_PRODUCTS = {
    "mm": (0, (-1,)), "bmm": (0, (-1,)), "mv": (0, (-1,)), "dot": (0, (-1,)), "vdot": (0, (-1,)),
    "addmm": (1, (-1,)), "addmv": (1, (-1,)), "baddbmm": (1, (-1,)), "addbmm": (1, (0, -1)),
    "_addmm_activation": (1, (-1,)), "_int_mm": (0, (-1,)), "_scaled_mm": (0, (-1,)),
    "_weight_int8pack_mm": (0, (-1,)), "_weight_int4pack_mm": (0, (-1,)), "linear": (0, (-1,)),
    "mkldnn_linear": (0, (-1,)), "_mixed_dtypes_linear": (0, (-1,)), "_sparse_addmm": (1, (-1,)),
    "sspaddmm": (1, (-1,)), "hspmm": (0, (-1,)), "_sparse_sparse_matmul": (0, (-1,)),
    "_cdist_forward": (0, (-1,)), "_euclidean_dist": (0, (-1,)), "_pdist_forward": (0, (-1,)),
}
# Solvers, factorizations, inverses and determinants, ``name: operand``: a result entry
# depends on the whole of that operand's matrix (``triangular_solve(b, A)``: A's).
_WHOLE_MATRIX = {
    name: 0 for name in (
        "_linalg_det", "_linalg_slogdet", "_linalg_eigh", "_linalg_eigvals", "_linalg_solve_ex",
        "_linalg_svd", "linalg_cholesky_ex", "linalg_eig", "linalg_eigvals", "linalg_householder_product",
        "linalg_inv_ex", "linalg_ldl_factor_ex", "linalg_ldl_solve", "linalg_lstsq", "linalg_lu",
        "linalg_lu_factor_ex", "linalg_lu_solve", "linalg_matrix_exp", "linalg_pinv", "linalg_qr",
        "linalg_solve_triangular", "cholesky", "cholesky_inverse", "geqrf", "ormqr", "_spsolve",
    )
} | {"triangular_solve": 1, "cholesky_solve": 1, "_cholesky_solve_helper": 1}
# Losses whose result for each sample (reduction="none") still combines a whole row.
_ROW_LOSSES = frozenset({"multi_margin_loss", "multilabel_margin_loss", "multilabel_margin_loss_forward"})
# Losses that pick one entry of each sample's row: a mean or sum combines one a sample.
_PICKING_LOSSES = frozenset({"nll_loss_forward", "nll_loss2d_forward"})
# Entries an antialiased resampling filter spans, per input entry it steps over.
_FILTER_SPAN = {"bilinear": 2, "bicubic": 4, "lanczos": 6}


def reduced_width(func, args: tuple, kwargs: dict, result=None) -> tuple[int, torch.Tensor] | None:
    """``(width, operand)``: how many entries of ``operand`` one result of this ATen call
    (which returned ``result``) combines; None for an op that combines none (elementwise
    ops, views, copies, ``cat``, indexing, ``gather``, ``max(a, b)``)."""
    rule = _rule(func)
    if rule is None:
        return None
    call = _Call(func, args, kwargs, result)
    if rule not in _READS_VALUES:
        return rule(call)
    # Where a scatter's indices point is in their values: the grader's own ops that read
    # them run outside every mode, neither measured nor refused as the student's.
    with _disable_current_modes():
        return rule(call)


@functools.cache
def _rule(func):
    """How to read this op's width (``rule(call) -> (width, operand) | None``), or None
    for an op that never combines entries; chosen once per op."""
    name, arguments = _base_name(func), {argument.name for argument in func._schema.arguments}
    is_view = any(returned.alias_info is not None and not returned.alias_info.is_write
                  for returned in func._schema.returns)
    if torch.Tag.pointwise in func.tags or is_view:
        return None
    if name in _PRODUCTS:
        return functools.partial(_contraction, *_PRODUCTS[name])
    if _is_reduction(func, name, arguments) or name in _ALONG_DIM:
        return _along_dim
    if name in _WHOLE_TENSOR:
        return _whole_tensor
    if name in _WHOLE_MATRIX:
        return _whole_matrix
    if name in _SPECIAL:
        return _SPECIAL[name]
    if "backward" in name:
        return None  # the schema rules below read forward ops' arguments
    if {"weight", "stride", "padding"} <= arguments:
        return _convolution
    if "kernel_size" in arguments and name != "im2col":  # im2col copies the windows out
        return _pooling
    if "normalized_shape" in arguments:
        return _normalized
    if {"C", "HxW", "group"} <= arguments:
        return _group_norm
    if "batch_norm" in name:
        return _batch_norm
    if "output_size" in arguments and ("adaptive" in name or name.endswith("_aa")):
        return _resampling
    if "reduction" in arguments:
        return _loss
    return None


def _is_reduction(func, name: str, arguments: set[str]) -> bool:
    if name in _REDUCTIONS and "other" not in arguments:
        return True
    return _REDUCTION_TAG is not None and _REDUCTION_TAG in func.tags


class _Call:
    """One ATen call, as the rules read it: its arguments by their schema names."""

    def __init__(self, func, args: tuple, kwargs: dict, result):
        self.name = _base_name(func)
        self.args, self.kwargs, self.result = args, kwargs, result
        self.schema = _schema(func)

    def get(self, name: str, default=None):
        """The argument ``name`` as passed, or as the schema defaults it."""
        if name in self.kwargs:
            return self.kwargs[name]
        if name not in self.schema:
            return default
        index, argument = self.schema[name]
        if index < len(self.args):
            return self.args[index]
        return argument.default_value if argument.has_default_value() else default

    @property
    def tensor(self) -> torch.Tensor:
        """The first tensor argument: the input, in most ops."""
        return next(arg for arg in self.args if isinstance(arg, torch.Tensor))


@functools.cache
def _schema(func) -> dict:
    return {argument.name: (index, argument) for index, argument in enumerate(func._schema.arguments)}


def _base_name(func) -> str:
    """``cumsum`` for ``aten::cumsum`` and its in-place ``aten::cumsum_``."""
    name = func._schema.name.removeprefix("aten::")
    return name[:-1] if name.endswith("_") and not name.endswith("__") else name


def _product(sizes) -> int:
    return math.prod(int(size) for size in sizes)


def _over(tensor: torch.Tensor, dims) -> int:
    """Entries of ``tensor`` one result combines when reducing over ``dims`` (an int, a
    list; None or ``[]`` for every entry, as ATen reads them)."""
    if dims is None or (isinstance(dims, (list, tuple)) and not dims):
        return tensor.numel()
    width = 1
    for axis in ([dims] if isinstance(dims, (int, str)) else dims):
        if isinstance(axis, str):  # a named dimension
            axis = tensor.names.index(axis)
        width *= int(tensor.shape[axis]) if tensor.dim() else 1
    return width


# -- the rules: (width, operand) of one call ------------------------------------------------


def _along_dim(call: _Call):
    return _over(call.tensor, call.get("dim")), call.tensor


def _contraction(operand: int, axes: tuple[int, ...], call: _Call):
    tensor = call.args[operand]
    return (_product(tensor.shape[axis] for axis in axes), tensor) if tensor.dim() else None


def _whole_tensor(call: _Call):
    return call.tensor.numel(), call.tensor


def _whole_matrix(call: _Call):
    matrix = [arg for arg in call.args if isinstance(arg, torch.Tensor)][_WHOLE_MATRIX[call.name]]
    return _product(matrix.shape[-2:]), matrix


def _convolution(call: _Call):
    """Input channels (of a group) times the kernel's positions."""
    weight, groups = call.get("weight"), call.get("groups") or 1
    transposed = call.get("transposed") or "transpose" in call.name
    channels = int(weight.shape[0]) // groups if transposed else int(weight.shape[1])
    return channels * _product(weight.shape[2:]), call.tensor


def _pooling(call: _Call):
    """The window: ``kernel_size``, one size for every spatial dimension when it is one."""
    kernel = call.get("kernel_size")
    kernel = list(kernel) if isinstance(kernel, (list, tuple)) else [kernel]
    spatial = re.search(r"(\d)d", call.name)  # max_pool2d: 2 spatial dimensions
    if len(kernel) == 1 and spatial:
        kernel *= int(spatial.group(1))
    return _product(kernel), call.tensor


def _normalized(call: _Call):
    return _product(call.get("normalized_shape")), call.tensor


def _group_norm(call: _Call):
    return int(call.get("C")) // int(call.get("group")) * int(call.get("HxW")), call.tensor


def _batch_norm(call: _Call):
    """In training, each channel's statistics: over the batch and every position."""
    tensor = call.tensor
    training = call.get("training", "with_update" in call.name)
    return (tensor.numel() // max(int(tensor.shape[1]), 1), tensor) if training and tensor.dim() > 1 else None


def _resampling(call: _Call):
    """Adaptive pooling's widest window; an antialiased resize's filter, as wide as the
    step from one output to the next times the filter's span."""
    output = list(call.get("output_size"))
    sizes = [int(size) for size in call.tensor.shape[call.tensor.dim() - len(output):]]
    if "adaptive" in call.name:
        return _product(_widest_window(size, out) for size, out in zip(sizes, output)), call.tensor
    span = next((span for kind, span in _FILTER_SPAN.items() if kind in call.name), 2)
    widths = (min(size, -(-size // max(out, 1)) * span) for size, out in zip(sizes, output))
    return _product(widths), call.tensor


def _widest_window(size: int, out: int) -> int:
    """The widest window of adaptive pooling from ``size`` entries to ``out``."""
    return max((-(-(index + 1) * size // out) - index * size // out for index in range(out)), default=0)


def _loss(call: _Call):
    """``reduction``: 0 none, 1 mean, 2 sum (the schema's default is mean)."""
    tensor = call.tensor
    if call.get("reduction"):
        return (call.get("target") if call.name in _PICKING_LOSSES else tensor).numel(), tensor
    return (int(tensor.shape[-1]), tensor) if call.name in _ROW_LOSSES and tensor.dim() else None


def _renormed(call: _Call):
    """``renorm``, ``_weight_norm_interface``: a norm over every dimension but ``dim``
    (all of them for a weight norm's -1)."""
    tensor, dim = call.tensor, call.get("dim")
    if call.name == "_weight_norm_interface" and dim == -1:
        return tensor.numel(), tensor
    return tensor.numel() // max(int(tensor.shape[dim]), 1), tensor


def _trilinear(call: _Call):
    """``_trilinear`` (``F.bilinear``): sums over ``sumdim`` of three operands, each
    unsqueezed at its ``expand`` dimensions."""
    shapes = []
    for operand, expand in (("i1", "expand1"), ("i2", "expand2"), ("i3", "expand3")):
        shape = list(call.get(operand).shape)
        for axis in sorted(call.get(expand)):
            shape.insert(axis, 1)
        shapes.append(shape)
    return _product(max(shape[axis] for shape in shapes) for axis in call.get("sumdim")), call.get("i2")


def _most_repeated(keys: torch.Tensor) -> int:
    """How often the most frequent value of ``keys`` occurs: how many entries land in
    one place."""
    return int(torch.unique(keys.reshape(-1), return_counts=True)[1].max()) if keys.numel() else 0


def _scattered(call: _Call):
    """``scatter_add``, ``scatter_reduce``, ``scatter(..., reduce=)``: the entries whose
    index agrees (along ``dim``, in the same row) land on one result entry."""
    if call.name == "scatter" and call.get("reduce") is None:
        return None  # a plain scatter copies
    target, dim, index, source = call.get("self"), call.get("dim"), call.get("index"), call.get("src")
    source = source if isinstance(source, torch.Tensor) else index
    if index.dim() == 0:
        return 1, source
    size = int(target.shape[dim])
    rows = index.movedim(dim, -1).reshape(-1, index.shape[dim])  # the indices bound for one result row
    keys = torch.arange(rows.shape[0], device=rows.device)[:, None] * size + rows % size
    return _most_repeated(keys), source


def _indexed_add(call: _Call):
    """``index_add``, ``index_reduce``: the source's slices whose index agrees."""
    target = call.get("self")
    size = int(target.shape[call.get("dim")]) if target.dim() else 1
    return _most_repeated(call.get("index") % size), call.get("source")


def _put(call: _Call):
    """``put_``, ``index_put_``: with ``accumulate=True``, the entries sent to one place."""
    if not call.get("accumulate"):
        return None
    target = call.get("self")
    if call.name == "put":
        return _most_repeated(call.get("index") % max(target.numel(), 1)), call.get("source")
    key = None
    for axis, index in enumerate(call.get("indices")):
        if index is not None:
            if index.dtype == torch.bool:
                return None  # a mask picks each place once
            size = int(target.shape[axis])
            key = index % size if key is None else key * size + index % size
    return (_most_repeated(key), call.get("values")) if key is not None else None


def _counted(call: _Call):
    """``bincount``, ``histc``, ``histogram``: the fullest bin."""
    values = call.tensor
    if call.name == "bincount":
        return _most_repeated(values), values
    if call.get("weight") is not None:
        return values.numel(), values  # weighted: at most every entry in one bin
    counts = call.result[0] if isinstance(call.result, (tuple, list)) else call.result
    return (int(counts.max()) if counts.numel() else 0), values


def _bagged(call: _Call):
    """``embedding_bag``: the longest bag."""
    indices, offsets = call.get("indices"), call.get("offsets")
    ends = offsets if call.get("include_last_offset") else torch.cat(
        [offsets, offsets.new_tensor([indices.numel()])])
    return (int(torch.diff(ends).max()) if ends.numel() > 1 else 0), call.get("weight")


def _segments(call: _Call):
    """``segment_reduce``: the longest segment."""
    lengths, offsets = call.get("lengths"), call.get("offsets")
    if lengths is None and offsets is not None:
        lengths = torch.diff(offsets, dim=-1)
    longest = int(lengths.max()) if lengths is not None and lengths.numel() else call.get("data").numel()
    return longest, call.get("data")


def _duplicates(call: _Call):
    """Coalescing a sparse tensor, or making it dense, adds up its entries that share
    an index."""
    sparse = call.tensor
    if not sparse.is_sparse or sparse.is_coalesced() or sparse._nnz() == 0:
        return None
    key = None
    for axis, index in enumerate(sparse._indices()):  # one linear index per entry
        key = index if key is None else key * int(sparse.shape[axis]) + index
    return _most_repeated(key), sparse


def _along(name: str, reading=lambda tensor: tensor.shape[-1]):
    """A rule for an op that reads its argument ``name`` (by default along its last axis)."""
    def rule(call: _Call):
        tensor = call.get(name)
        return (int(reading(tensor)), tensor) if isinstance(tensor, torch.Tensor) else None
    return rule


# Ops whose width needs its own reading: ``name: rule(call) -> (width, operand) | None``.
_SPECIAL = {
    "_fft_r2c": _along_dim, "_fft_c2c": _along_dim, "_fft_c2r": _along_dim,  # every entry of `dim`
    "searchsorted": _along("sorted_sequence"), "bucketize": _along("boundaries", torch.numel),
    "isin": _along("test_elements", torch.numel), "trace": _along("self", lambda t: min(t.shape)),
    "dist": lambda call: max(((arg.numel(), arg) for arg in call.args if isinstance(arg, torch.Tensor)),
                             key=lambda found: found[0]),
    "_ctc_loss": _along("log_probs", lambda t: t.shape[0] * t.shape[-1]),  # time x classes
    "renorm": _renormed, "_weight_norm_interface": _renormed, "_trilinear": _trilinear,
    "scatter": _scattered, "scatter_add": _scattered, "scatter_reduce": _scattered,
    "index_add": _indexed_add, "index_reduce": _indexed_add,
    "put": _put, "index_put": _put, "_index_put_impl": _put,
    "bincount": _counted, "histc": _counted, "histogram": _counted,
    "_histogramdd_from_bin_cts": _counted, "_histogramdd_from_bin_tensors": _counted,
    "_embedding_bag": _bagged, "_embedding_bag_forward_only": _bagged, "segment_reduce": _segments,
    "_coalesce": _duplicates, "_to_dense": _duplicates,
}
# The rules that read their tensors' values, not only their shapes.
_READS_VALUES = frozenset({_scattered, _indexed_add, _put, _counted, _bagged, _segments, _duplicates})
