// The segments of a model version a writer fills (docs/weight-updates.md): fresh memfds the
// daemon hands a writer of its own user writable, then seals before anyone reads them.
#pragma once
#include <cstdint>
#include <string>

namespace weightd {

// A fresh memfd of `bytes` (its pages reserved), sealed against shrink and grow but not write,
// holding a copy of the first `bytes` of `sourceFd` (a served, sealed segment). Returns the new
// descriptor, the caller's to close. E_SHM_CREATE, E_OUT_OF_MEMORY, E_SHM_MAP, E_SHM_WRITE,
// E_SHM_SEAL.
int createWritableCopy(int sourceFd, uint64_t bytes, const std::string& name);

// Seals a segment createWritableCopy made against write (and further seals): from here on no
// process can change a byte of it. E_UPDATE_MAPPED while any process still maps it writable
// (the kernel refuses F_SEAL_WRITE then); E_SHM_SEAL otherwise. A segment sealed already is left
// as it is, so a commit refused part way can be asked again.
void sealWritten(int fd, uint32_t segment);

}  // namespace weightd
