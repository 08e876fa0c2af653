"""A manifest's torch views in few torch calls, where its layout repeats.

A torch tensor made from Python costs about a microsecond of argument parsing and dispatch (more
on CUDA), which at 50k tensors was most of an attach. Checkpoints repeat themselves: layer after
layer, expert after expert, the tensor p places on has the same dtype, shape and size, and lies a
constant number of bytes further on. Each such run of k tensors is one ``as_strided`` of shape
(k, *shape), whose ``unbind(0)`` makes the k views in C++, with exactly the shape, strides and
storage offset the view made alone would have.

Runs are found in manifest order with numpy comparisons of the columns (no per-tensor Python
and no torch kernels: a fresh process's first torch sort or nonzero cost more than the views
themselves on a busy machine, through its thread pool; numpy's run on the calling thread). A layout that does not repeat is
made a view at a time, with searches spaced ever further apart, so it pays little for them.

The views are made below autograd's view tracking: each is a plain tensor over the segment's
storage, with no ``_base`` and a version counter of its own, instead of an autograd view of the
segment's tensor. That tracking (a DifferentiableViewMeta per view, some 300 bytes) was half of
each view's cost: 0.25 against 0.6 us a view at 50k views on the development VM, and 310 against
600 bytes of new memory, whose page faults a fresh process pays (bench/RESULTS.md, issue 33).
The weights need none of it: they require no grad, are never resized, and are read-only.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

# Same-shaped tensors looked at after a run's first tensor when guessing the period, and how far.
_CANDIDATES = 4
_WINDOW = 2048
# Tensors made one at a time after a failed search before the next: doubles per failure.
_MAX_SKIP = 1024

Layout = Tuple[Tuple[int, ...], Tuple[int, ...], int]


def column_views(cols: Any, layouts: Sequence[Layout], views_of: Callable[[int], Any]) -> List[Any]:
    """A view per tensor of a manifest's columns (a ``TensorColumns``), in their order.

    ``layouts[k]``: shape k's dims, row-major strides (elements) and element count.
    ``views_of(segment)``: that segment's ``SegmentViews``. A tensor that is not a plain whole
    view of its dtype (empty, packed, misaligned, out of bounds) goes through
    ``SegmentViews.view``, which knows what to do with it."""
    import torch

    # A private guard of torch's (its own custom ops use it); a torch without it tracks views.
    below_autograd = getattr(torch._C, "_AutoDispatchBelowADInplaceOrView", contextlib.nullcontext)
    with below_autograd():
        return _views(cols, layouts, views_of)


def _views(cols: Any, layouts: Sequence[Layout], views_of: Callable[[int], Any]) -> List[Any]:
    n = len(cols)
    out: List[Any] = [None] * n
    segments: Dict[int, Any] = {}
    segment_of, dtype_of, shape_of, offset_of, bytes_of = (cols.column(key) for key in ("segment", "dtype", "shape", "offset", "bytes"))

    def emit(first: int, end: int, p: int, step: int) -> None:
        """Tensors first, first + p, ... (before end), each ``step`` bytes after the one before."""
        segment = segment_of[first]
        views = segments.get(segment)
        if views is None:
            views = segments[segment] = views_of(segment)
        base = views.base(cols.dtypes[dtype_of[first]])
        itemsize = base.element_size()
        dims, strides, numel = layouts[shape_of[first]]
        offset, nbytes = offset_of[first], bytes_of[first]
        k = len(range(first, end, p))
        plain = nbytes and numel * itemsize == nbytes and not offset % itemsize and not step % itemsize
        if plain and offset + (k - 1) * step + nbytes <= views.raw.numel():
            if k == 1:
                out[first] = base.as_strided(dims, strides, offset // itemsize)
            else:
                out[first:end:p] = base.as_strided((k, *dims), (step // itemsize, *strides), offset // itemsize).unbind(0)
        else:
            out[first:end:p] = [views.view(cols[j]) for j in range(first, end, p)]

    arrays = _Arrays.of(cols)
    s, skip, failures = 0, 0, 0
    while s < n:
        run = None if skip or arrays is None else _run_at(arrays, s)
        if run is None:
            emit(s, s + 1, 1, 0)
            s += 1
            if skip:
                skip -= 1
            else:
                failures += 1
                skip = min(1 << failures, _MAX_SKIP)
            continue
        p, step, end = run
        for r in range(p):
            emit(s + r, end, p, step)
        s, failures = end, 0
    return out


class _Arrays:
    """The columns the run search compares, as numpy arrays: ``keys`` (shape, dtype, segment and
    bytes: what a run's tensors share with the one p before them) and ``offset``."""

    __slots__ = ("np", "shape", "keys", "offset")

    @classmethod
    def of(cls, cols: Any) -> Optional["_Arrays"]:
        """None where numpy is not installed (torch loads it where it is): then every tensor is
        made alone, as correct and some three times slower."""
        try:
            import numpy as np
        except ImportError:
            return None
        self = cls()
        self.np = np
        self.keys = [cols.array(key) for key in ("shape", "dtype", "segment", "bytes")]
        self.shape, self.offset = self.keys[0], cols.array("offset")
        return self


def _run_at(c: _Arrays, s: int) -> Any:
    """(p, step, end): tensors s..end-1 repeat with period p (at least three times), each ``step``
    bytes after the one p before it; None when no period among the first candidates does."""
    n = len(c.shape)
    same_shape = c.np.flatnonzero(c.shape[s + 1 : min(n, s + _WINDOW)] == c.shape[s])[:_CANDIDATES]
    for j in (same_shape + (s + 1)).tolist():
        p = j - s
        if n - s < 3 * p:
            return None
        step = int(c.offset[j] - c.offset[s])
        if step < 0 or not _repeats(c, s, p, step, 0, 2 * p):
            continue
        # Double until the pattern breaks (or the columns end), then halve the gap to where; each
        # check covers only what is not known yet, so finding a run of L costs O(L) compares.
        good, bad, most = 2 * p, None, n - s - p
        while bad is None and good < most:
            trial = min(2 * good, most)
            if _repeats(c, s, p, step, good, trial):
                good = trial
            else:
                bad = trial
        while bad is not None and bad - good > 1:
            mid = (good + bad) // 2
            if _repeats(c, s, p, step, good, mid):
                good = mid
            else:
                bad = mid
        return p, step, s + good + p
    return None


def _repeats(c: _Arrays, s: int, p: int, step: int, lo: int, hi: int) -> bool:
    """Whether each tensor s + lo .. s + hi - 1 has the dtype, shape, segment and size of the one
    p after it, which lies ``step`` bytes further on."""
    a, b = slice(s + lo, s + hi), slice(s + lo + p, s + hi + p)
    if any((key[a] != key[b]).any() for key in c.keys):
        return False
    return bool((c.offset[b] - c.offset[a] == step).all())
