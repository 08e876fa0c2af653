// The host ranks of one node share the hashing of their content digests. Each rank fills its own
// arena on its own threads, but every rank digests the same checkpoint tensors whole
// (content_digests.h): alone, a rank at tp=2 read again and hashed every byte of the half it did
// not copy, so the node hashed the checkpoint twice (bench/RESULTS.md, issue 33). In a group
// (FillOptions.group, as the cuda ranks' fill group) the ranks share one ContentDigests: each
// piece is hashed by whichever rank reads it whole first, the last rank to finish its copies
// reads and hashes what no rank covered, and every rank returns the same digests.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "content_digests.h"

namespace weightd {

class FileSet;
struct FillControl;
struct DigestGroup;

// One rank's place in a digest group, from its join to its digests. A member that is destroyed
// before finish() returned (its fill failed) fails the group, so the others do not wait for it.
class DigestGroupMember {
 public:
  // Joins group `id` of `size` members (made by the first to join, from its `files` and
  // `tensors`; a later member's must be the same: E_BAD_GROUP). E_FILL_CANCELLED when the group
  // has failed already.
  DigestGroupMember(const std::string& id, unsigned size, const std::vector<std::string>& files, const std::vector<TensorRange>& tensors,
                    const FileSet& fileSet);
  ~DigestGroupMember();
  DigestGroupMember(const DigestGroupMember&) = delete;
  DigestGroupMember& operator=(const DigestGroupMember&) = delete;

  ContentDigests& digests();
  // After this member's copies: waits for the other members' (saying so in
  // control.waitingForGroup), and the last to finish reads and hashes what no member's reads
  // covered, on `threads` threads. Sets control.digests to the group's digests, and
  // control.digestRereadBytes to what this member read again. A cancel while waiting fails the
  // group.
  void finish(const FileSet& fileSet, unsigned threads, FillControl& control);

 private:
  std::string id_;
  std::shared_ptr<DigestGroup> group_;
  bool finished_ = false;
};

// Says that one member of group `id` of `size` will not fill (it adopted its shard from the
// keeper): the others finish without it, or the group is forgotten when none is left.
void leaveDigestGroup(const std::string& id, unsigned size);

}  // namespace weightd
