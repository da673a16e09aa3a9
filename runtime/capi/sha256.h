// SHA-256 (FIPS 180-4) of the executable's body, which the header seals. Written here
// so the runtime library links nothing but the C++ standard library.
#pragma once
#include <cstddef>
#include <cstdint>

namespace nr {
void sha256(const uint8_t *data, size_t size, uint8_t digest[32]);
}
