"""PullPlan.check (weightd_client/pull.py): before each pull by a plan, every tensor must lie where
the plan named it. torch tensors are checked by address and element count alone (the fast path on
an update's way), and a tensor that moved or was resized is refused by name before anything is
sent; the device is synchronized once the check passed."""

import pytest

from weightd_client.protocol import ProtocolError
from weightd_client.pull import PullPlan


class Tensor:
    """What PullPlan reads of a contiguous torch CUDA tensor on device 0."""

    is_cuda = True

    def __init__(self, ptr, numel, itemsize=2):
        self.ptr, self.n, self.itemsize = ptr, numel, itemsize

    class device:  # noqa: N801 - torch's attribute
        index = 0

    def data_ptr(self):
        return self.ptr

    def numel(self):
        return self.n

    def element_size(self):
        return self.itemsize

    def is_contiguous(self):
        return True


class Sources:
    ordinal = 0

    def __init__(self):
        self.synced = 0

    def synchronize(self):
        self.synced += 1


def plan_over(tensors):
    """A plan as PullPlan.__init__ leaves it, without a daemon: its places and the fast path's table."""
    plan = object.__new__(PullPlan)
    plan.model, plan.conn, plan._sources = "m", object(), Sources()
    plan._places = [(n, t, t.data_ptr(), t.numel() * t.element_size()) for n, t in tensors.items()]
    plan._torch = [(True, t.numel()) for t in tensors.values()]
    return plan


def test_unchanged_tensors_pass_and_the_device_is_synchronized():
    plan = plan_over({"a": Tensor(0x1000, 8), "b": Tensor(0x2000, 4)})
    plan.check()
    plan.check()
    assert plan._sources.synced == 2


@pytest.mark.parametrize("change", ["moved", "resized"])
def test_a_tensor_that_moved_or_was_resized_is_refused_by_name_before_the_device_is_synchronized(change):
    b = Tensor(0x2000, 4)
    plan = plan_over({"a": Tensor(0x1000, 8), "b": b})
    if change == "moved":
        b.ptr = 0x3000
    else:
        b.n = 2
    with pytest.raises(ProtocolError) as refused:
        plan.check()
    assert refused.value.code == "E_PULL_PLAN_STALE" and "'b'" in str(refused.value) and "open a new plan" in str(refused.value)
    assert plan._sources.synced == 0


def test_a_closed_plan_is_refused():
    plan = plan_over({"a": Tensor(0x1000, 8)})
    plan.conn = None
    with pytest.raises(ProtocolError) as refused:
        plan.check()
    assert refused.value.code == "E_PULL_PLAN_CLOSED"
