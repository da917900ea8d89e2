#include "python/bindings.h"

namespace tfring {
namespace python {

void bindStore(pybind11::module_& m) {}

}  // namespace python
}  // namespace tfring
