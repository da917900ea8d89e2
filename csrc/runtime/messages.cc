#include "runtime/messages.h"

namespace tfring {
namespace runtime {

bool Meta::operator==(const Meta& o) const {
  return name == o.name && type == o.type && dtype == o.dtype && shape == o.shape &&
         op == o.op && root == o.root && prescale == o.prescale &&
         postscale == o.postscale && device == o.device && wire == o.wire && splits == o.splits &&
         error == o.error;
}

int64_t Meta::numElements() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::string dimsString(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

std::string Meta::shapeString() const { return dimsString(shape); }

std::vector<int64_t> partLayout(const std::vector<std::vector<int64_t>>& shapes) {
  std::vector<int64_t> out{static_cast<int64_t>(shapes.size())};
  for (const auto& s : shapes) {
    out.push_back(static_cast<int64_t>(s.size()));
    out.insert(out.end(), s.begin(), s.end());
  }
  return out;
}

bool readPartLayout(const std::vector<int64_t>& layout,
                    std::vector<std::vector<int64_t>>* shapes) {
  shapes->clear();
  if (layout.empty() || layout[0] < 0) return false;
  size_t at = 1;
  for (int64_t i = 0; i < layout[0]; ++i) {
    if (at >= layout.size() || layout[at] < 0 ||
        static_cast<uint64_t>(layout[at]) > layout.size() - at - 1)
      return false;
    const size_t rank = static_cast<size_t>(layout[at++]);
    shapes->emplace_back(layout.begin() + at, layout.begin() + at + rank);
    at += rank;
  }
  return at == layout.size();
}

void Meta::write(wire::Writer& w) const {
  w.putStr(name);
  w.put<uint8_t>(static_cast<uint8_t>(type));
  w.put<uint8_t>(static_cast<uint8_t>(dtype));
  w.putI64s(shape);
  w.put<uint8_t>(static_cast<uint8_t>(op));
  w.put<int32_t>(root);
  w.put<double>(prescale);
  w.put<double>(postscale);
  w.put<int32_t>(device);
  w.put<uint8_t>(static_cast<uint8_t>(wire));
  w.putI64s(splits);
  w.putStr(error);
}

Meta Meta::read(wire::Reader& r) {
  Meta m;
  m.name = r.getStr();
  uint8_t type = r.get<uint8_t>(), dtype = r.get<uint8_t>();
  m.shape = r.getI64s();
  uint8_t op = r.get<uint8_t>();
  // Enum values index tables later on: refuse what no build would send.
  if (type > static_cast<uint8_t>(CollectiveType::kJoin) || dtype >= kNumDataTypes ||
      op >= kNumReduceOps)
    fail(Code::kInternal, "malformed tensor description for '", m.name, "' (collective ",
         unsigned(type), ", dtype ", unsigned(dtype), ", op ", unsigned(op), ")");
  m.type = static_cast<CollectiveType>(type);
  m.dtype = static_cast<DataType>(dtype);
  m.op = static_cast<ReduceOp>(op);
  m.root = r.get<int32_t>();
  m.prescale = r.get<double>();
  m.postscale = r.get<double>();
  m.device = r.get<int32_t>();
  const uint8_t wire = r.get<uint8_t>();
  if (wire >= kNumWireTypes)
    fail(Code::kInternal, "malformed tensor description for '", m.name, "' (wire ",
         unsigned(wire), ")");
  m.wire = static_cast<WireType>(wire);
  m.splits = r.getI64s();
  m.error = r.getStr();
  return m;
}

void Response::write(wire::Writer& w) const {
  w.put<uint64_t>(seq);
  w.put<uint32_t>(static_cast<uint32_t>(new_ids.size()));
  for (auto& p : new_ids) {
    w.put<int32_t>(p.first);
    w.putStr(p.second);
  }
  w.put<uint32_t>(static_cast<uint32_t>(groups.size()));
  for (auto& g : groups) {
    w.put<uint8_t>(g.kind);
    w.put<uint8_t>(static_cast<uint8_t>(g.type));
    w.put<uint32_t>(static_cast<uint32_t>(g.names.size()));
    for (auto& n : g.names) w.putStr(n);
    w.put<uint32_t>(static_cast<uint32_t>(g.dim0s.size()));
    for (auto& d : g.dim0s) w.putI64s(d);
    w.putStr(g.error);
    w.put<uint32_t>(static_cast<uint32_t>(g.fill.size()));
    for (auto& m : g.fill) m.write(w);
  }
}

Response Response::read(wire::Reader& r) {
  Response resp;
  resp.seq = r.get<uint64_t>();
  // Counts are checked against the bytes left before anything is sized.
  uint32_t n = r.getCount(8);  // i32 id + u32 string length
  for (uint32_t i = 0; i < n; ++i) {
    int32_t id = r.get<int32_t>();
    resp.new_ids.emplace_back(id, r.getStr());
  }
  uint32_t ng = r.getCount(18);  // the smallest group: kind, type, 4 counts
  resp.groups.resize(ng);
  for (auto& g : resp.groups) {
    const uint8_t kind = r.get<uint8_t>();
    if (kind > Group::kInvalid) fail(Code::kInternal, "malformed group kind ", unsigned(kind));
    g.kind = static_cast<Group::Kind>(kind);
    g.type = static_cast<CollectiveType>(r.get<uint8_t>());
    uint32_t nn = r.getCount(4);
    for (uint32_t i = 0; i < nn; ++i) g.names.push_back(r.getStr());
    uint32_t nd = r.getCount(4);
    for (uint32_t i = 0; i < nd; ++i) g.dim0s.push_back(r.getI64s());
    g.error = r.getStr();
    uint32_t nf = r.getCount(4);
    for (uint32_t i = 0; i < nf; ++i) g.fill.push_back(Meta::read(r));
  }
  return resp;
}

}  // namespace runtime
}  // namespace tfring
