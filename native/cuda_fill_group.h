// Fills of several GPUs of one process that share one pass over the files. Each rank actor's
// worker fills its own device, but on a node with several GPUs they name the same group (an id
// and a size, FillOptions.group): each fill joins it and waits, and once all have joined, the
// last to arrive runs one copy engine for all of them (cuda_copy_engine.h), so bytes several
// GPUs need are read once. Every member returns when the group's fill ends, with its error.
#pragma once
#include <string>

#include "cuda_copy_engine.h"

namespace weightd {

// Joins group `id` of `size` members with `self` and returns when the group's fill has ended.
// A member whose control.cancel is set while waiting for the others leaves, and the members
// already waiting fail with E_FILL_CANCELLED, as do members arriving later; once every member
// has been told (or once it is not among the 16 most recently abandoned), the id is forgotten. Once the fill runs, a cancel stops all of it.
void fillInGroup(const std::string& id, unsigned size, const FillMember& self, const FillOptions& options);

// Says that one member of group `id` of `size` will not fill (it adopted its shard from the
// keeper): the group's fill runs with the others once they have joined, or is forgotten when
// none is left. Without it the members that fill would wait for ever for one that never comes.
void leaveFillGroup(const std::string& id, unsigned size);

}  // namespace weightd
