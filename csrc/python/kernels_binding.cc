#include "python/bindings.h"

namespace tfring {
namespace python {

void bindKernels(pybind11::module_& m) {}

}  // namespace python
}  // namespace tfring
