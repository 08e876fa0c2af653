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
struct CopyOp;
struct Chunk;

// What a member does with a chunk of a row-parallel tensor's rows, whose columns are split among
// the ranks (a rank's rows lie apart: read_ranges.h's readsRowsApart). Each rank read its own
// columns, one pread per row, while one of them read the chunk's rows whole for the digests, so
// at tp=2 the node read those tensors 1.5 times over (bench/RESULTS.md, issue 33). Now the first
// member to reach a chunk reads its rows whole once, hashes them, and writes every other member's
// columns into that member's arena too (Deliver); the others skip the chunk (Skip). A member the
// first could not serve (it offered no such op, or cuts the tensor into other chunks) reads its
// own columns as before (Own).
struct RowsPlan {
  enum class Kind { Own, Skip, Deliver };
  struct Dest {
    int fd = -1;           // the group's duplicate of the member's segment
    uint32_t segment = 0;  // for errors
    uint64_t dst = 0;      // where the chunk's packed columns go in that segment
    uint64_t rowBytes = 0;
    uint64_t colOffset = 0;  // the member's columns within a row
  };
  Kind kind = Kind::Own;
  // Deliver: the chunk's whole rows in the file, and this member's columns within a row.
  uint64_t spanStart = 0;
  uint64_t spanBytes = 0;
  uint64_t colOffset = 0;
  std::vector<Dest> dests;
};

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
  // Before this member's copies: offers the group its row-parallel ops (`ops` whose rows lie
  // apart and cover a whole checkpoint tensor's rows), cut into chunks of `chunkBytes`, with its
  // arena's `segmentFds`, of which the group keeps duplicates until its last member is gone: a
  // member that delivers never writes into a descriptor number its owner may have closed.
  void offerRows(const std::vector<CopyOp>& ops, const std::vector<int>& segmentFds, uint64_t chunkBytes);
  // For chunk `c` of `op` (an op whose rows lie apart): Own, Skip, or Deliver (see RowsPlan).
  // Waits first (saying so in control.waitingForGroup) until every member has offered its rows or
  // left, so that each chunk is planned knowing every member it can be delivered to.
  // E_FILL_CANCELLED when this fill is cancelled meanwhile.
  RowsPlan planRows(const CopyOp& op, const Chunk& c, FillControl& control);

 private:
  std::string id_;
  std::shared_ptr<DigestGroup> group_;
  unsigned index_ = 0;  // its place among the members, in the order they joined
  bool finished_ = false;
};

// Says that one member of group `id` of `size` will not fill (it adopted its shard from the
// keeper): the others finish without it, or the group is forgotten when none is left.
void leaveDigestGroup(const std::string& id, unsigned size);

}  // namespace weightd
