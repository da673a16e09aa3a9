// The kinds' shape rules (runtime/isa.py's rule functions) that the C loader has so
// far: output types derived from input types and attributes, with isa.py's checks of
// what depends on the input types. isa_table.NATIVE_RULES lists the kinds ported;
// the loader refuses a file naming the field, as validate.py does.
#pragma once
#include <string>
#include <vector>

#include "executable.h"
#include "msgpack_reader.h"

namespace nr {

struct RuleError {
  std::string reason;
  std::string field;  // an attribute name, or "in" / "residual"
};

// True and `out` set if `kind` has a native rule (throws RuleError when the inputs and
// attributes break it); false if the rule is not ported yet.
bool derive_types(const std::string &kind, const std::vector<TensorType> &in,
                  const mp::Node &attrs, std::vector<TensorType> &out);

}  // namespace nr
