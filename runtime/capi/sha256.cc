#include "sha256.h"

#include <cstring>

#if defined(__x86_64__) && !defined(NR_SHA256_PORTABLE)  // (NR_SHA256_PORTABLE: tests of the other path)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace nr {
namespace {

constexpr uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};

inline uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

void block_scalar(uint32_t h[8], const uint8_t *p) {
  uint32_t w[64];
  for (int i = 0; i < 16; ++i)
    w[i] = uint32_t(p[4 * i]) << 24 | uint32_t(p[4 * i + 1]) << 16 |
           uint32_t(p[4 * i + 2]) << 8 | uint32_t(p[4 * i + 3]);
  for (int i = 16; i < 64; ++i) {
    uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
    uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
  for (int i = 0; i < 64; ++i) {
    uint32_t t1 = k + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + w[i];
    uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    k = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
  }
  h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += k;
}

#if defined(__x86_64__) && !defined(NR_SHA256_PORTABLE)
// The same rounds on the CPU's SHA extensions (Intel's and AMD's since Zen): ~7x the
// scalar code here, which is what a load spends hashing a large executable.
__attribute__((target("sha,sse4.1,ssse3"))) void blocks_sha_ni(uint32_t h[8], const uint8_t *p, size_t n) {
  const __m128i kByteSwap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
  __m128i tmp = _mm_shuffle_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(h)), 0xB1);  // CDAB
  __m128i state1 = _mm_shuffle_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(h + 4)), 0x1B);  // EFGH
  __m128i state0 = _mm_alignr_epi8(tmp, state1, 8);     // ABEF
  state1 = _mm_blend_epi16(state1, tmp, 0xF0);          // CDGH
  for (; n; --n, p += 64) {
    const __m128i abef = state0, cdgh = state1;
    __m128i w[4];  // w[r % 4]: the schedule's words 4r..4r+3, then 4r+16..4r+19
    for (int i = 0; i < 4; ++i)
      w[i] = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p + 16 * i)), kByteSwap);
    for (int r = 0; r < 16; ++r) {
      __m128i m = _mm_add_epi32(w[r & 3], _mm_loadu_si128(reinterpret_cast<const __m128i *>(K + 4 * r)));
      state1 = _mm_sha256rnds2_epu32(state1, state0, m);
      state0 = _mm_sha256rnds2_epu32(state0, state1, _mm_shuffle_epi32(m, 0x0E));
      if (r < 12) {
        __m128i t = _mm_sha256msg1_epu32(w[r & 3], w[(r + 1) & 3]);
        t = _mm_add_epi32(t, _mm_alignr_epi8(w[(r + 3) & 3], w[(r + 2) & 3], 4));
        w[r & 3] = _mm_sha256msg2_epu32(t, w[(r + 3) & 3]);
      }
    }
    state0 = _mm_add_epi32(state0, abef);
    state1 = _mm_add_epi32(state1, cdgh);
  }
  tmp = _mm_shuffle_epi32(state0, 0x1B);           // FEBA
  state1 = _mm_shuffle_epi32(state1, 0xB1);        // DCHG
  state0 = _mm_blend_epi16(tmp, state1, 0xF0);     // DCBA
  state1 = _mm_alignr_epi8(state1, tmp, 8);        // HGFE
  _mm_storeu_si128(reinterpret_cast<__m128i *>(h), state0);
  _mm_storeu_si128(reinterpret_cast<__m128i *>(h + 4), state1);
}

bool has_sha_ni() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_SSE4_1) || !(c & bit_SSSE3)) return false;
  return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & bit_SHA);
}
#endif

// `n` 64-byte blocks into the state.
void blocks(uint32_t h[8], const uint8_t *p, size_t n) {
#if defined(__x86_64__) && !defined(NR_SHA256_PORTABLE)
  static const bool sha_ni = has_sha_ni();
  if (sha_ni) return blocks_sha_ni(h, p, n);
#endif
  for (; n; --n, p += 64) block_scalar(h, p);
}

}  // namespace

void Sha256::update(const uint8_t *data, size_t size) {
  if (size == 0) return;  // data may be NULL then
  total_ += size;
  if (pending_size_) {
    size_t take = size < 64 - pending_size_ ? size : 64 - pending_size_;
    std::memcpy(pending_ + pending_size_, data, take);
    pending_size_ += take;
    data += take;
    size -= take;
    if (pending_size_ < 64) return;
    blocks(h_, pending_, 1);
    pending_size_ = 0;
  }
  size_t full = size / 64 * 64;
  blocks(h_, data, size / 64);
  std::memcpy(pending_, data + full, size - full);
  pending_size_ = size - full;
}

void Sha256::finish(uint8_t digest[32]) {
  uint8_t tail[128] = {0};
  std::memcpy(tail, pending_, pending_size_);
  tail[pending_size_] = 0x80;
  size_t tail_len = pending_size_ + 9 <= 64 ? 64 : 128;
  uint64_t bits = total_ * 8;
  for (int i = 0; i < 8; ++i) tail[tail_len - 1 - i] = uint8_t(bits >> (8 * i));
  blocks(h_, tail, tail_len / 64);
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 4; ++j) digest[4 * i + j] = uint8_t(h_[i] >> (24 - 8 * j));
}

void sha256(const uint8_t *data, size_t size, uint8_t digest[32]) {
  Sha256 hash;
  hash.update(data, size);
  hash.finish(digest);
}

}  // namespace nr
