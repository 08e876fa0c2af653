// The segments of a model version a writer fills (docs/weight-updates.md): fresh memfds the
// daemon hands a writer of its own user writable, then seals before anyone reads them.
#pragma once
#include <cstdint>
#include <string>

namespace weightd {

// A fresh memfd of `bytes` (its pages reserved, zero), sealed against shrink and grow but not
// write: what a writer fills from nothing (an engine's published processed parameters, see
// docs/engines.md). Returns the descriptor, the caller's to close. E_SHM_CREATE, E_OUT_OF_MEMORY,
// E_SHM_SEAL.
int createWritableSegment(uint64_t bytes, const std::string& name);

// As createWritableSegment, holding a copy of the first `bytes` of `sourceFd` (a served, sealed
// segment). E_SHM_MAP and E_SHM_WRITE besides.
int createWritableCopy(int sourceFd, uint64_t bytes, const std::string& name);

// Seals a segment createWritableSegment or createWritableCopy made against write (and further
// seals): from here on no process can change a byte of it. E_UPDATE_MAPPED while any process still maps it writable
// (the kernel refuses F_SEAL_WRITE then); E_SHM_SEAL otherwise. A segment sealed already is left
// as it is, so a commit refused part way can be asked again. `command` is the commit that seals
// (commit_update, commit_publish): what the refusal tells the writer to send again.
void sealWritten(int fd, uint32_t segment, const std::string& command);

}  // namespace weightd
