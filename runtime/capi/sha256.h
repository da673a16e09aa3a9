// SHA-256 (FIPS 180-4) of the executable's body, which the header seals. Written here
// so the runtime library links nothing but the C++ standard library.
#pragma once
#include <cstddef>
#include <cstdint>

namespace nr {

// A digest fed in pieces, so a file can be hashed as it is read, a piece at a time.
class Sha256 {
 public:
  void update(const uint8_t *data, size_t size);
  void finish(uint8_t digest[32]);  // once; the object is spent after

 private:
  uint32_t h_[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                    0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  uint8_t pending_[64] = {0};  // bytes of a block not yet full
  size_t pending_size_ = 0;
  uint64_t total_ = 0;
};

void sha256(const uint8_t *data, size_t size, uint8_t digest[32]);

}  // namespace nr
