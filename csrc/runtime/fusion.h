// Tensor fusion: which ready tensors run together as one collective.
//
// Both the coordinator (for responses it negotiates) and every engine (for
// the steady-state fast path, agreement.cc) group ready tensors with this
// one function, so a given ordered list of tensors always fuses the same way
// on every rank. Allreduces that agree on dtype, op, scale factors and device
// are packed, in order of readiness, into one buffer of at most `threshold`
// bytes; every other collective runs alone. Tensors on different wires
// (Meta::wire) never share a buffer: a fused buffer has one wire.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/messages.h"

namespace tfring {
namespace runtime {

size_t tensorBytes(const Meta& m);

// Returns the groups as index lists into `ready`, in execution order.
std::vector<std::vector<size_t>> fuseReady(const std::vector<const Meta*>& ready,
                                           int64_t threshold);

}  // namespace runtime
}  // namespace tfring
