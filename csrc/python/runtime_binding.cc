#include "python/bindings.h"

namespace tfring {
namespace python {

void bindRuntime(pybind11::module_& m) {}

}  // namespace python
}  // namespace tfring
