// The keeper's wire format (docs/spec/keeper-wire.md): frames "WGTK" + u16 BE version + u32 BE
// payload length + payload; integers big-endian, strings u16 length + UTF-8, blobs u32 length +
// bytes. Every decoding failure is a KeeperError whose code goes back to the client. The
// constants below are the spec's; test/keeper/keeperWire.test.ts holds them to
// test/vectors/keeper-wire.json, which the TypeScript side's tests read too.
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace weightd::keeper {

constexpr char kMagic[] = "WGTK";
constexpr uint16_t kProtocolVersion = 1;
constexpr size_t kHeaderBytes = 10;
// A KEEP carries a rank's whole record: 35 bytes a tensor of digests, ~16 a tensor of packed plan
// (docs/spec/keeper-wire.md §1 says why 64 MiB, and what an older keeper does past 1 MiB).
constexpr uint32_t kMaxRequestBytes = 64 << 20;
// Any other op's request is a few strings at most (TAKE, DROP: two of up to 65,535 bytes): one
// larger than this is refused on its op byte, before the keeper reserves memory for it, and so is
// a KEEP this large that brought no fds with its first byte (§4: the first batch rides on it).
constexpr uint32_t kMaxOtherRequestBytes = 1 << 20;
// Every reply frame, header included, is at most this (the client's bound): the keeper refuses a
// KEEP that would make its LIST reply, the largest, pass it (E_KEEPER_FULL), so the records it
// holds are bounded too and every daemon can LIST them.
constexpr uint32_t kMaxReplyBytes = 256 << 20;
constexpr size_t kMaxRecordFds = 4096;

enum class Op : uint8_t { Keep = 1, Take = 2, Drop = 3, List = 4, Ping = 5, Watch = 6 };

class KeeperError : public std::runtime_error {
 public:
  KeeperError(std::string code, const std::string& message) : std::runtime_error(message), code_(std::move(code)) {}
  const std::string& code() const { return code_; }

 private:
  std::string code_;
};

// Checks a frame header: magic, version, and a payload length within kMaxRequestBytes.
uint32_t payloadLength(const uint8_t* header);
// Checks a payload longer than kMaxOtherRequestBytes on its op byte: only a KEEP may be, and one
// whose first byte brought fds.
void checkLargeRequest(uint32_t length, uint8_t op, bool withFds);

// Bounds-checked reads of a request payload; a short payload is E_BAD_REQUEST naming the field.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t u8(const char* what);
  uint16_t u16(const char* what);
  uint32_t u32(const char* what);
  std::string str(const char* what);
  std::string blob(const char* what);
  // A request with bytes past its last field is malformed too.
  void end();

 private:
  const uint8_t* take(size_t n, const char* what);
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

class Writer {
 public:
  Writer& u8(uint8_t v);
  Writer& u16(uint16_t v);
  Writer& u32(uint32_t v);
  Writer& u64(uint64_t v);
  Writer& str(const std::string& s);
  Writer& blob(const std::string& b);
  // The payload written so far, framed.
  std::vector<uint8_t> frame() const;

 private:
  std::vector<uint8_t> payload_;
};

// status 0 + nothing else yet: the ok reply a handler appends its body to.
Writer okReply();
std::vector<uint8_t> errorFrame(const std::string& code, const std::string& message);

}  // namespace weightd::keeper
