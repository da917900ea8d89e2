// Copies whose destination should not be cached: a large collective's
// output, written once here and read by the caller much later (after the
// rest of a 100 MB gradient bucket has gone through the cache). A normal
// store first reads the destination line into the cache (read for
// ownership) and later writes it back; a non-temporal store writes the line
// to memory directly, so the copy moves 2 bytes per byte instead of 3.
// Measured on the 2-core VM, 64 MB out of a 1 MB source in cache: 4.0 ms
// with memcpy, 2.6 ms streaming.
//
// The same stores serve bytes handed to another core through shared
// memory: written normally they sit in the producer's cache and the
// consumer pulls each line across; when the two cores are far apart (on
// the VM, in phases lasting minutes, likely vCPUs on different CCDs) that
// halves the bandwidth. 64 MB through a 4 MB ring between two threads:
// 7.4-9.8 ms normal and 7.3-10.8 streaming in the fast phase; 15-18 ms
// normal and 6-7 ms streaming in the slow one.
#pragma once

#include <cstddef>

namespace tfring {
namespace kernels {

// memcpy(dst, src, n) with non-temporal stores where the CPU has them (any
// x86-64), memcpy elsewhere and for small n. Ends with a store fence, so the
// bytes are ordered before any later release store (a completion flag),
// unless `fence` is false: then the caller calls streamFence() before
// publishing.
void copyStreaming(void* dst, const void* src, size_t n, bool fence = true);
void streamFence();

}  // namespace kernels
}  // namespace tfring
