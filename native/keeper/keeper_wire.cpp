#include "keeper_wire.h"

#include <cstring>

namespace weightd::keeper {

uint32_t payloadLength(const uint8_t* h) {
  if (std::memcmp(h, kMagic, 4) != 0) {
    char shown[5] = {};
    for (int i = 0; i < 4; ++i) shown[i] = h[i] >= 0x20 && h[i] < 0x7f ? static_cast<char>(h[i]) : '?';
    throw KeeperError("E_BAD_MAGIC", std::string("frame starts with \"") + shown + "\", not \"" + kMagic + "\": this socket is a weightd keeper's; connect with its protocol");
  }
  uint16_t version = static_cast<uint16_t>(h[4] << 8 | h[5]);
  if (version != kProtocolVersion) {
    throw KeeperError("E_BAD_VERSION", "frame has protocol version " + std::to_string(version) + "; this keeper speaks version " +
                                           std::to_string(kProtocolVersion) + ": use a weightd of the same protocol");
  }
  uint32_t length = uint32_t{h[6]} << 24 | uint32_t{h[7]} << 16 | uint32_t{h[8]} << 8 | uint32_t{h[9]};
  if (length > kMaxRequestBytes) {
    throw KeeperError("E_FRAME_TOO_LARGE", "request payload of " + std::to_string(length) + " bytes exceeds the keeper's limit of " +
                                               std::to_string(kMaxRequestBytes) + " bytes: keep records smaller");
  }
  if (length == 0) throw KeeperError("E_BAD_REQUEST", "request payload is empty: it must start with an op byte");
  return length;
}

void checkLargeRequest(uint32_t length, uint8_t op, bool withFds) {
  if (length <= kMaxOtherRequestBytes) return;
  if (op != static_cast<uint8_t>(Op::Keep)) {
    throw KeeperError("E_FRAME_TOO_LARGE", "request payload of " + std::to_string(length) + " bytes for op " + std::to_string(op) + " exceeds the keeper's limit of " +
                                               std::to_string(kMaxOtherRequestBytes) + " bytes for any op but KEEP (1)");
  }
  if (!withFds) {
    throw KeeperError("E_NO_FDS", "KEEP of " + std::to_string(length) + " bytes came with no fds on its first byte: a record holds the descriptors of its memory, attach them (docs/spec/keeper-wire.md §4)");
  }
}

const uint8_t* Reader::take(size_t n, const char* what) {
  if (size_ - pos_ < n) {
    throw KeeperError("E_BAD_REQUEST", std::string("request truncated: ") + what + " needs " + std::to_string(n) + " bytes at offset " +
                                           std::to_string(pos_) + " of a " + std::to_string(size_) + "-byte payload");
  }
  const uint8_t* p = data_ + pos_;
  pos_ += n;
  return p;
}

uint8_t Reader::u8(const char* what) { return *take(1, what); }

uint16_t Reader::u16(const char* what) {
  const uint8_t* p = take(2, what);
  return static_cast<uint16_t>(p[0] << 8 | p[1]);
}

uint32_t Reader::u32(const char* what) {
  const uint8_t* p = take(4, what);
  return uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | uint32_t{p[3]};
}

std::string Reader::str(const char* what) {
  uint16_t n = u16(what);
  const uint8_t* p = take(n, what);
  return std::string(reinterpret_cast<const char*>(p), n);
}

std::string Reader::blob(const char* what) {
  uint32_t n = u32(what);
  const uint8_t* p = take(n, what);
  return std::string(reinterpret_cast<const char*>(p), n);
}

void Reader::end() {
  if (pos_ != size_) {
    throw KeeperError("E_BAD_REQUEST", "request has " + std::to_string(size_ - pos_) + " bytes past its last field (payload of " +
                                           std::to_string(size_) + " bytes)");
  }
}

Writer& Writer::u8(uint8_t v) {
  payload_.push_back(v);
  return *this;
}

Writer& Writer::u16(uint16_t v) { return u8(static_cast<uint8_t>(v >> 8)).u8(static_cast<uint8_t>(v)); }
Writer& Writer::u32(uint32_t v) { return u16(static_cast<uint16_t>(v >> 16)).u16(static_cast<uint16_t>(v)); }
Writer& Writer::u64(uint64_t v) { return u32(static_cast<uint32_t>(v >> 32)).u32(static_cast<uint32_t>(v)); }

// Strings the keeper writes are its own messages or strings it once read as u16-prefixed, so
// they fit; a longer message is cut rather than mis-framed.
Writer& Writer::str(const std::string& s) {
  size_t n = s.size() > 0xffff ? 0xffff : s.size();
  u16(static_cast<uint16_t>(n));
  payload_.insert(payload_.end(), s.begin(), s.begin() + static_cast<std::ptrdiff_t>(n));
  return *this;
}

Writer& Writer::blob(const std::string& b) {
  u32(static_cast<uint32_t>(b.size()));
  payload_.insert(payload_.end(), b.begin(), b.end());
  return *this;
}

std::vector<uint8_t> Writer::frame() const {
  Writer header;
  for (int i = 0; i < 4; ++i) header.u8(static_cast<uint8_t>(kMagic[i]));
  header.u16(kProtocolVersion).u32(static_cast<uint32_t>(payload_.size()));
  std::vector<uint8_t> out(kHeaderBytes + payload_.size());
  std::memcpy(out.data(), header.payload_.data(), kHeaderBytes);
  if (!payload_.empty()) std::memcpy(out.data() + kHeaderBytes, payload_.data(), payload_.size());
  return out;
}

Writer okReply() {
  Writer w;
  w.u8(0);
  return w;
}

std::vector<uint8_t> errorFrame(const std::string& code, const std::string& message) {
  Writer w;
  w.u8(1).str(code).str(message);
  return w.frame();
}

}  // namespace weightd::keeper
