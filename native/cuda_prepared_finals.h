// Finals made at begin_update for a pull that said which segments it will write ("prepare",
// docs/weight-updates.md, "Pulling from the writer's tensors"): made and mapped while the trainer
// still computes, and kept mapped in the daemon between requests, so that the pull's copies start
// at once into them. Making and mapping 83 finals of an 8 GB model took 7.3 ms of an H100 pull
// (issue 31); the copies themselves take 5.5 ms. Each set lives in a process-wide table under a
// number that the update desk holds, until the commit that used it or the end of its update drops
// it. The memory itself is held by the descriptors handed to the caller: dropping a set only
// unmaps it from the daemon.
#pragma once
#include <cuda.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "cuda_vmm.h"

namespace weightd {

// Keeps `segments` (one per segment of a rank's layout, each made and mapped with device
// `deviceIndex`'s primary context current; empty where none) mapped under a new number (never 0).
uint32_t keepPrepared(int deviceIndex, std::vector<VmmSegment> segments);

// Unmaps set `id` (once the calls using it returned); an unknown number is no error (dropped already).
void cudaDropPrepared(uint32_t id);

// A set's mappings while a call uses them: pointer(i) is where segment i's final is mapped
// read-write here, 0 where the set has none. Held by the call, so a drop meanwhile waits for it.
class PreparedFinals {
 public:
  virtual ~PreparedFinals() = default;
  virtual CUdeviceptr pointer(size_t segment) const = 0;
};

// Set `id` (0: none, an empty result) of device `deviceIndex` with `segments` segments; E_BAD_PLAN
// where no such set is (dropped, or of another device or layout).
std::shared_ptr<const PreparedFinals> preparedFinals(uint32_t id, int deviceIndex, size_t segments);

}  // namespace weightd
