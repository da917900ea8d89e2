// A collective's statistics as the dict the Python readers return
// (tfring._core.last_collective_stats(), and DirectAllreduce's in
// tfring._core_testing).
#pragma once

#include <pybind11/pybind11.h>

#include "collectives/collective_stats.h"

namespace tfring {
namespace python {

inline pybind11::dict collectiveDict(const collectives::CollectiveStats& st) {
  pybind11::dict d;
  d["collective"] = st.collective;
  d["algo"] = st.algo;
  d["ranks"] = st.size;
  d["bytes"] = st.bytes;
  d["hops"] = st.hops;
  d["bytes_sent"] = st.bytes_sent;
  d["wire"] = st.wire;
  return d;
}

}  // namespace python
}  // namespace tfring
