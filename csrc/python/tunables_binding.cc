// tfring._core's view of the tunables table (common/tunables.h): the
// declarations, for tfring/_tunables.py and docs/tunables.md's test, and
// typed reads that Python code uses instead of repeating a default.
#include <pybind11/stl.h>

#include <map>
#include <string>

#include "common/status.h"
#include "common/tunables.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace tfring {
namespace python {

namespace {

using Overrides = std::map<std::string, std::string>;

py::object typedValue(const tunables::Tunable& t) {
  const char* n = t.name;
  switch (t.type) {
    case tunables::Type::kInt:
    case tunables::Type::kBytes:
      if (!tunables::isSet(n) && *t.dflt == '\0') return py::none();
      return py::int_(tunables::getInt(n));
    case tunables::Type::kSeconds:
    case tunables::Type::kMillis:
      return py::float_(tunables::getDouble(n));
    case tunables::Type::kBool:
      return py::bool_(tunables::getBool(n));
    default: {
      std::string v = tunables::getString(n);
      if (v.empty() && *t.dflt == '\0') return py::none();
      return py::str(v);
    }
  }
}

}  // namespace

Overrides configArg(const py::object& config) {
  Overrides out;
  if (config.is_none()) return out;
  for (auto kv : py::cast<py::dict>(config)) {
    std::string k = py::str(kv.first), v = py::str(kv.second);
    out[k] = v;
  }
  return out;
}

void bindTunables(py::module_& m) {
  m.def("tunables", [] {
    py::list out;
    for (const tunables::Tunable& t : tunables::all()) {
      py::dict d;
      d["name"] = t.name;
      d["type"] = tunables::typeName(t.type);
      d["default"] = t.dflt;
      if (t.type == tunables::Type::kEnum) {
        py::list c;
        std::string cur;
        for (const char* p = t.choices;; ++p) {
          if (*p == '|' || *p == '\0') {
            c.append(cur);
            cur.clear();
            if (*p == '\0') break;
          } else {
            cur += *p;
          }
        }
        d["choices"] = c;
      } else if (t.type != tunables::Type::kString && t.type != tunables::Type::kBool) {
        d["min"] = t.min;
        d["max"] = t.max;
      }
      d["launcher"] = t.launcher;
      d["doc"] = t.doc;
      out.append(d);
    }
    return out;
  }, "The core's tunables: a dict per TFRING_* variable (name, type, default as "
     "documented, choices or min/max, launcher, doc), in declaration order.");
  m.def("tunable_value", [](const std::string& name, const py::object& config) {
    tunables::ScopedOverrides scope(configArg(config));
    return typedValue(tunables::find(name));
  }, py::arg("name"), py::arg("config") = py::none(),
     "The value of the core tunable `name` as the core reads it: `config` (a mapping "
     "of TFRING_* names to values), then the overrides given to init, then the "
     "environment, then the default; None where it is unset without a default. A bad "
     "value raises TfringError naming the variable and what it accepts.");
}

}  // namespace python
}  // namespace tfring
