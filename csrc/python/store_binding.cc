// tfring._core stores: the rendezvous key-value stores, for the launcher, the
// runtime's Python side and the tests. Every call that may block (network,
// filesystem, waiting for keys) releases the GIL so other Python threads,
// including one that serves or sets the awaited keys, keep running.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <vector>

#include "python/bindings.h"
#include "python/errors.h"
#include "rendezvous/file_store.h"
#include "rendezvous/store.h"
#include "rendezvous/tcp_store.h"

namespace py = pybind11;

namespace tfring {
namespace python {
namespace {

using rendezvous::Bytes;
using rendezvous::Store;
using Release = py::call_guard<py::gil_scoped_release>;

Bytes toBytes(const py::bytes& b) {
  char* data = nullptr;
  Py_ssize_t n = 0;
  if (PyBytes_AsStringAndSize(b.ptr(), &data, &n) != 0) throw py::error_already_set();
  return Bytes(reinterpret_cast<uint8_t*>(data), reinterpret_cast<uint8_t*>(data) + n);
}

}  // namespace

void bindStore(py::module_& m) {
  registerErrors(m);

  py::class_<Store, std::shared_ptr<Store>>(m, "Store", R"doc(
Key-value rendezvous store shared by every rank of a job. Abstract: use
TcpStore, FileStore or PrefixStore. Values are bytes; counters made by add()
hold decimal text (get() on a counter returns e.g. b"3").)doc")
      .def(
          "set",
          [](Store& s, const std::string& key, const py::bytes& value) {
            Bytes v = toBytes(value);
            py::gil_scoped_release release;
            s.set(key, v);
          },
          py::arg("key"), py::arg("value"), "Sets key to value (bytes).")
      .def(
          "get",
          [](Store& s, const std::string& key, double timeout) {
            Bytes v;
            {
              py::gil_scoped_release release;
              v = s.get(key, timeout);
            }
            return py::bytes(reinterpret_cast<const char*>(v.data()), v.size());
          },
          py::arg("key"), py::arg("timeout") = 30.0,
          "Waits up to timeout seconds for key and returns its value; raises "
          "TfringTimeoutError naming the key.")
      .def("add", &Store::add, py::arg("key"), py::arg("delta"), Release(),
           "Atomically adds delta to the integer counter key (created as 0) and "
           "returns the new value.")
      .def("wait", &Store::wait, py::arg("keys"), py::arg("timeout") = 30.0, Release(),
           "Waits up to timeout seconds until every key exists; raises "
           "TfringTimeoutError naming the missing keys.")
      .def("check", &Store::check, py::arg("keys"), Release(),
           "True if every key exists now (does not wait).")
      .def(
          "get_many",
          [](Store& s, const std::vector<std::string>& keys, double timeout) {
            std::vector<Bytes> vs;
            {
              py::gil_scoped_release release;
              vs = s.getMany(keys, timeout);
            }
            py::list out;
            for (auto& v : vs)
              out.append(py::bytes(reinterpret_cast<const char*>(v.data()), v.size()));
            return out;
          },
          py::arg("keys"), py::arg("timeout") = 30.0,
          "Waits up to timeout seconds for every key and returns their values in "
          "order (the TCP store in one round trip); raises TfringTimeoutError "
          "naming the missing keys.");

  py::class_<rendezvous::TcpStoreServer, std::shared_ptr<rendezvous::TcpStoreServer>>(
      m, "TcpStoreServer", R"doc(
Serves a TcpStore from this process (rank 0) on a background thread. Port 0
picks a free port; read it back from .port. Only clients presenting the same
secret are served. stop() (also run on destruction) disconnects every client.)doc")
      .def(py::init([](const std::string& host, int port, std::string secret) {
             py::gil_scoped_release release;
             return std::make_shared<rendezvous::TcpStoreServer>(host, port, std::move(secret));
           }),
           py::arg("host"), py::arg("port"), py::arg("secret"))
      .def_property_readonly("port", &rendezvous::TcpStoreServer::port)
      .def("stop", &rendezvous::TcpStoreServer::stop, Release());

  py::class_<rendezvous::TcpStore, Store, std::shared_ptr<rendezvous::TcpStore>>(
      m, "TcpStore", R"doc(
Client of a TcpStoreServer. Connecting retries until timeout seconds pass
(the server may not be up yet), then authenticates with the job secret.)doc")
      .def(py::init([](const std::string& host, int port, std::string secret, double timeout) {
             py::gil_scoped_release release;
             return std::make_shared<rendezvous::TcpStore>(host, port, std::move(secret), timeout);
           }),
           py::arg("host"), py::arg("port"), py::arg("secret"), py::arg("timeout") = 30.0);

  py::class_<rendezvous::FileStore, Store, std::shared_ptr<rendezvous::FileStore>>(
      m, "FileStore", R"doc(
Store kept as files in a directory every rank can see (created if missing).)doc")
      .def(py::init([](std::string path) {
             py::gil_scoped_release release;
             return std::make_shared<rendezvous::FileStore>(std::move(path));
           }),
           py::arg("path"));

  py::class_<rendezvous::PrefixStore, Store, std::shared_ptr<rendezvous::PrefixStore>>(
      m, "PrefixStore", "Namespaces every key of base as '<prefix>/<key>'.")
      .def(py::init<std::string, std::shared_ptr<Store>>(), py::arg("prefix"),
           py::arg("base"));
}

}  // namespace python
}  // namespace tfring
