#include "rendezvous/wire.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace cpprun::rendezvous::wire {
namespace {

// Wire numbers, index = wire byte. kNone marks a hole.
constexpr int kNone = -1;
#define Q(x) static_cast<int>(QueryType::x)
constexpr int kLegacyTable[] = {Q(SET),  Q(COMPARE_SET), Q(GET),       Q(ADD),       Q(CHECK),
                                Q(WAIT), Q(GETNUMKEYS),  Q(WATCH_KEY), Q(DELETE_KEY)};
constexpr int kV21Table[] = {Q(SET),    Q(COMPARE_SET), Q(GET),        Q(ADD),
                             Q(CHECK),  Q(WAIT),        Q(GETNUMKEYS), Q(DELETE_KEY),
                             Q(APPEND), Q(MULTI_GET),   Q(MULTI_SET),  Q(CANCEL_WAIT)};
constexpr int kV2Table[] = {Q(VALIDATE),    Q(SET),       Q(COMPARE_SET), Q(GET),
                            Q(ADD),         Q(CHECK),     Q(WAIT),        Q(GETNUMKEYS),
                            Q(DELETE_KEY),  Q(APPEND),    Q(MULTI_GET),   Q(MULTI_SET),
                            Q(CANCEL_WAIT), Q(PING),      Q(QUEUE_PUSH),  Q(QUEUE_POP),
                            Q(QUEUE_LEN),   Q(LIST_KEYS), Q(BARRIER)};
#undef Q

// The wire numbering of one dialect: entries[byte] is a QueryType (as int) or kNone.
struct Numbering {
  const int* entries;
  size_t size;
};

template <size_t N>
constexpr Numbering numberingOf(const int (&table)[N]) {
  return {table, N};
}

Numbering numberingFor(Dialect d) {
  switch (d) {
    case Dialect::kLegacy:
      return numberingOf(kLegacyTable);
    case Dialect::kV21:
      return numberingOf(kV21Table);
    case Dialect::kV2:
      return numberingOf(kV2Table);
  }
  return {nullptr, 0};
}

std::string overLimit(const char* what, uint64_t len, size_t limit) {
  return std::string(what) + " of " + std::to_string(len) + " bytes exceeds the limit of " +
         std::to_string(limit);
}

std::string tooManyKeys(uint64_t n, QueryType t, size_t limit) {
  return std::to_string(n) + " keys in one " + queryTypeName(t) + " exceed the limit of " +
         std::to_string(limit);
}

// Reads fields from a byte range; every read says whether the bytes were there.
class Cursor {
 public:
  Cursor(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  size_t position() const { return pos_; }

  bool u32(uint32_t* v) {
    if (size_ - pos_ < 4) return false;
    *v = loadU32(data_ + pos_);
    pos_ += 4;
    return true;
  }
  bool u64(uint64_t* v) {
    if (size_ - pos_ < 8) return false;
    *v = loadU64(data_ + pos_);
    pos_ += 8;
    return true;
  }
  // Length-prefixed field. *status becomes kError if the length exceeds `limit`.
  template <typename T>
  bool lengthPrefixed(T* out, size_t limit, const char* what, ParseStatus* status,
                      std::string* error) {
    uint64_t len = 0;
    if (!u64(&len)) return false;
    if (len > limit) {
      *status = ParseStatus::kError;
      *error = overLimit(what, len, limit);
      return false;
    }
    if (size_ - pos_ < len) return false;
    out->assign(data_ + pos_, data_ + pos_ + len);
    pos_ += static_cast<size_t>(len);
    return true;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace

const char* dialectName(Dialect d) {
  switch (d) {
    case Dialect::kLegacy:
      return "torch<=2.0";
    case Dialect::kV21:
      return "torch 2.1";
    case Dialect::kV2:
      return "torch>=2.2";
  }
  return "?";
}

const char* queryTypeName(QueryType t) {
  switch (t) {
    case QueryType::VALIDATE:
      return "VALIDATE";
    case QueryType::SET:
      return "SET";
    case QueryType::COMPARE_SET:
      return "COMPARE_SET";
    case QueryType::GET:
      return "GET";
    case QueryType::ADD:
      return "ADD";
    case QueryType::CHECK:
      return "CHECK";
    case QueryType::WAIT:
      return "WAIT";
    case QueryType::GETNUMKEYS:
      return "GETNUMKEYS";
    case QueryType::WATCH_KEY:
      return "WATCH_KEY";
    case QueryType::DELETE_KEY:
      return "DELETE_KEY";
    case QueryType::APPEND:
      return "APPEND";
    case QueryType::MULTI_GET:
      return "MULTI_GET";
    case QueryType::MULTI_SET:
      return "MULTI_SET";
    case QueryType::CANCEL_WAIT:
      return "CANCEL_WAIT";
    case QueryType::PING:
      return "PING";
    case QueryType::QUEUE_PUSH:
      return "QUEUE_PUSH";
    case QueryType::QUEUE_POP:
      return "QUEUE_POP";
    case QueryType::QUEUE_LEN:
      return "QUEUE_LEN";
    case QueryType::LIST_KEYS:
      return "LIST_KEYS";
    case QueryType::BARRIER:
      return "BARRIER";
  }
  return "?";
}

std::optional<QueryType> queryTypeFromWire(Dialect d, uint8_t byte) {
  const Numbering n = numberingFor(d);
  if (byte >= n.size || n.entries[byte] == kNone) return std::nullopt;
  return static_cast<QueryType>(n.entries[byte]);
}

std::optional<uint8_t> queryTypeToWire(Dialect d, QueryType t) {
  const Numbering n = numberingFor(d);
  for (size_t i = 0; i < n.size; ++i) {
    if (n.entries[i] == static_cast<int>(t)) return static_cast<uint8_t>(i);
  }
  return std::nullopt;
}

uint64_t loadU64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof(v));  // host order = little-endian on every supported platform
  return v;
}

uint32_t loadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

bool parseCounter(const Bytes& value, int64_t* out) {
  std::string text(value.begin(), value.end());
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (end == text.c_str() || errno == ERANGE) return false;
  *out = v;
  return true;
}

Bytes formatCounter(int64_t value) {
  std::string text = std::to_string(value);
  return Bytes(text.begin(), text.end());
}

void appendU8(Bytes* out, uint8_t v) { out->push_back(v); }

void appendU32(Bytes* out, uint32_t v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  out->insert(out->end(), p, p + sizeof(v));
}

void appendU64(Bytes* out, uint64_t v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  out->insert(out->end(), p, p + sizeof(v));
}

void appendI64(Bytes* out, int64_t v) { appendU64(out, static_cast<uint64_t>(v)); }

void appendBytes(Bytes* out, const uint8_t* data, size_t size) {
  appendU64(out, size);
  out->insert(out->end(), data, data + size);
}

void appendString(Bytes* out, const std::string& s) {
  appendBytes(out, reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

void appendBytes(Bytes* out, const Bytes& b) { appendBytes(out, b.data(), b.size()); }

ParseStatus parseRequest(Dialect d, const Limits& limits, const uint8_t* data, size_t size,
                         Request* out, size_t* consumed, std::string* error) {
  if (size == 0) return ParseStatus::kNeedMore;
  auto type = queryTypeFromWire(d, data[0]);
  if (!type) {
    *error =
        "unknown query type " + std::to_string(data[0]) + " for a " + dialectName(d) + " client";
    return ParseStatus::kError;
  }
  Cursor c(data + 1, size - 1);
  ParseStatus status = ParseStatus::kNeedMore;
  // Decode straight into *out, keeping the capacity of its strings and vectors: a connection
  // reuses one Request, so steady-state decoding allocates nothing.
  Request& r = *out;
  r.type = *type;
  r.integer = 0;
  r.u32 = 0;
  size_t key_count = 0;
  size_t value_count = 0;
  auto nextKey = [&]() -> std::string& {
    if (key_count == r.keys.size()) r.keys.emplace_back();
    return r.keys[key_count++];
  };
  auto nextValue = [&]() -> Bytes& {
    if (value_count == r.values.size()) r.values.emplace_back();
    return r.values[value_count++];
  };

  auto key = [&](std::string* k) {
    return c.lengthPrefixed(k, limits.max_key_bytes, "key", &status, error);
  };
  auto value = [&](Bytes* v) {
    return c.lengthPrefixed(v, limits.max_value_bytes, "value", &status, error);
  };
  auto keyCount = [&](uint64_t* n) {
    if (!c.u64(n)) return false;
    if (*n > limits.max_keys_per_request) {
      status = ParseStatus::kError;
      *error = tooManyKeys(*n, r.type, limits.max_keys_per_request);
      return false;
    }
    return true;
  };
  auto oneKey = [&]() { return key(&nextKey()); };
  auto oneKeyOneValue = [&]() { return key(&nextKey()) && value(&nextValue()); };
  auto keyList = [&]() {
    uint64_t n = 0;
    if (!keyCount(&n)) return false;
    for (uint64_t i = 0; i < n; ++i) {
      if (!key(&nextKey())) return false;
    }
    return true;
  };

  bool complete = false;
  uint64_t u = 0;
  switch (r.type) {
    case QueryType::SET:
    case QueryType::APPEND:
    case QueryType::QUEUE_PUSH:
      complete = oneKeyOneValue();
      break;
    case QueryType::COMPARE_SET:
      complete = key(&nextKey()) && value(&nextValue()) && value(&nextValue());
      break;
    case QueryType::GET:
    case QueryType::DELETE_KEY:
    case QueryType::WATCH_KEY:
    case QueryType::QUEUE_POP:
    case QueryType::QUEUE_LEN:
      complete = oneKey();
      break;
    case QueryType::ADD:
      complete = oneKey() && c.u64(&u);
      r.integer = static_cast<int64_t>(u);
      break;
    case QueryType::BARRIER:
      complete = oneKey() && c.u64(&u);
      r.integer = static_cast<int64_t>(u);
      break;
    case QueryType::CHECK:
    case QueryType::WAIT:
    case QueryType::MULTI_GET:
      complete = keyList();
      break;
    case QueryType::MULTI_SET: {
      uint64_t n = 0;
      complete = keyCount(&n);
      for (uint64_t i = 0; complete && i < n; ++i) {
        complete = key(&nextKey()) && value(&nextValue());
      }
      break;
    }
    case QueryType::GETNUMKEYS:
    case QueryType::CANCEL_WAIT:
    case QueryType::LIST_KEYS:
      complete = true;
      break;
    case QueryType::VALIDATE:
    case QueryType::PING:
      complete = c.u32(&r.u32);
      break;
  }
  if (status == ParseStatus::kError) return status;
  if (!complete) return ParseStatus::kNeedMore;
  r.keys.resize(key_count);
  r.values.resize(value_count);
  *consumed = 1 + c.position();
  return ParseStatus::kRequest;
}

namespace {

// The fields of each request after its type byte, for the resumable scan: a fixed part, then
// for list requests a count and that many items.
enum class Field : uint8_t { kKey, kValue, kU64, kU32 };
struct Layout {
  Field fixed[3];
  uint8_t fixed_count;
  bool list;
  Field item[2];
  uint8_t item_count;
};

Layout layoutOf(QueryType t) {
  using F = Field;
  switch (t) {
    case QueryType::SET:
    case QueryType::APPEND:
    case QueryType::QUEUE_PUSH:
      return {{F::kKey, F::kValue}, 2, false, {}, 0};
    case QueryType::COMPARE_SET:
      return {{F::kKey, F::kValue, F::kValue}, 3, false, {}, 0};
    case QueryType::GET:
    case QueryType::DELETE_KEY:
    case QueryType::WATCH_KEY:
    case QueryType::QUEUE_POP:
    case QueryType::QUEUE_LEN:
      return {{F::kKey}, 1, false, {}, 0};
    case QueryType::ADD:
    case QueryType::BARRIER:
      return {{F::kKey, F::kU64}, 2, false, {}, 0};
    case QueryType::CHECK:
    case QueryType::WAIT:
    case QueryType::MULTI_GET:
      return {{}, 0, true, {F::kKey}, 1};
    case QueryType::MULTI_SET:
      return {{}, 0, true, {F::kKey, F::kValue}, 2};
    case QueryType::VALIDATE:
    case QueryType::PING:
      return {{F::kU32}, 1, false, {}, 0};
    case QueryType::GETNUMKEYS:
    case QueryType::CANCEL_WAIT:
    case QueryType::LIST_KEYS:
      break;
  }
  return {{}, 0, false, {}, 0};
}

}  // namespace

ParseStatus scanRequest(Dialect d, const Limits& limits, const uint8_t* data, size_t size,
                        ScanState* st, size_t* consumed, std::string* error) {
  if (st->pos == 0) {
    if (size == 0) return ParseStatus::kNeedMore;
    auto type = queryTypeFromWire(d, data[0]);
    if (!type) {
      *error =
          "unknown query type " + std::to_string(data[0]) + " for a " + dialectName(d) + " client";
      return ParseStatus::kError;
    }
    st->type = *type;
    st->pos = 1;
  }
  const Layout layout = layoutOf(st->type);
  // Skips one field; 1 = done, 0 = needs more bytes, -1 = error.
  auto skip = [&](Field f) -> int {
    size_t left = size - st->pos;
    switch (f) {
      case Field::kU32:
        if (left < 4) return 0;
        st->pos += 4;
        return 1;
      case Field::kU64:
        if (left < 8) return 0;
        st->pos += 8;
        return 1;
      case Field::kKey:
      case Field::kValue: {
        if (left < 8) return 0;
        uint64_t len = loadU64(data + st->pos);
        size_t limit = f == Field::kKey ? limits.max_key_bytes : limits.max_value_bytes;
        if (len > limit) {
          *error = overLimit(f == Field::kKey ? "key" : "value", len, limit);
          return -1;
        }
        if (left - 8 < len) return 0;
        st->pos += 8 + static_cast<size_t>(len);
        return 1;
      }
    }
    return -1;
  };
  while (st->fields_done < layout.fixed_count) {
    int r = skip(layout.fixed[st->fields_done]);
    if (r <= 0) return r < 0 ? ParseStatus::kError : ParseStatus::kNeedMore;
    ++st->fields_done;
  }
  if (layout.list) {
    if (!st->counted) {
      if (size - st->pos < 8) return ParseStatus::kNeedMore;
      uint64_t n = loadU64(data + st->pos);
      if (n > limits.max_keys_per_request) {
        *error = tooManyKeys(n, st->type, limits.max_keys_per_request);
        return ParseStatus::kError;
      }
      st->items_left = n;
      st->counted = true;
      st->pos += 8;
    }
    while (st->items_left > 0) {
      while (st->item_fields_done < layout.item_count) {
        int r = skip(layout.item[st->item_fields_done]);
        if (r <= 0) return r < 0 ? ParseStatus::kError : ParseStatus::kNeedMore;
        ++st->item_fields_done;
      }
      st->item_fields_done = 0;
      --st->items_left;
    }
  }
  *consumed = st->pos;
  return ParseStatus::kRequest;
}

bool encodeRequest(Dialect d, const Request& r, Bytes* out) {
  auto type = queryTypeToWire(d, r.type);
  if (!type) return false;
  appendU8(out, *type);
  switch (r.type) {
    case QueryType::SET:
    case QueryType::APPEND:
    case QueryType::QUEUE_PUSH:
      appendString(out, r.keys.at(0));
      appendBytes(out, r.values.at(0));
      break;
    case QueryType::COMPARE_SET:
      appendString(out, r.keys.at(0));
      appendBytes(out, r.values.at(0));
      appendBytes(out, r.values.at(1));
      break;
    case QueryType::GET:
    case QueryType::DELETE_KEY:
    case QueryType::WATCH_KEY:
    case QueryType::QUEUE_POP:
    case QueryType::QUEUE_LEN:
      appendString(out, r.keys.at(0));
      break;
    case QueryType::ADD:
    case QueryType::BARRIER:
      appendString(out, r.keys.at(0));
      appendI64(out, r.integer);
      break;
    case QueryType::CHECK:
    case QueryType::WAIT:
    case QueryType::MULTI_GET:
      appendU64(out, r.keys.size());
      for (const auto& k : r.keys) appendString(out, k);
      break;
    case QueryType::MULTI_SET:
      appendU64(out, r.keys.size());
      for (size_t i = 0; i < r.keys.size(); ++i) {
        appendString(out, r.keys[i]);
        appendBytes(out, r.values.at(i));
      }
      break;
    case QueryType::GETNUMKEYS:
    case QueryType::CANCEL_WAIT:
    case QueryType::LIST_KEYS:
      break;
    case QueryType::VALIDATE:
    case QueryType::PING:
      appendU32(out, r.u32);
      break;
  }
  return true;
}

void RequestDecoder::feed(const uint8_t* data, size_t size) {
  // Compact before growing so a long-lived connection's buffer stays small.
  if (read_pos_ > 0 && read_pos_ == buffer_.size()) {
    buffer_.clear();
    read_pos_ = 0;
  } else if (read_pos_ > 64 * 1024 && read_pos_ > buffer_.size() / 2) {
    buffer_.erase(buffer_.begin(), buffer_.begin() + static_cast<std::ptrdiff_t>(read_pos_));
    read_pos_ = 0;
  }
  buffer_.insert(buffer_.end(), data, data + size);
}

ParseStatus RequestDecoder::next(Request* out, std::string* error) {
  const uint8_t* data = buffer_.data() + read_pos_;
  size_t size = buffer_.size() - read_pos_;
  if (!dialect_) {
    if (size == 0) return ParseStatus::kNeedMore;
    if (data[0] != 0) {
      dialect_ = no_handshake_;
    } else {
      // A legacy SET is 17+ bytes and its key length could only equal the magic with a ~1 GB
      // key, so waiting for five bytes is safe for both kinds of client.
      if (size < 5) return ParseStatus::kNeedMore;
      dialect_ = loadU32(data + 1) == kValidationMagic ? Dialect::kV2 : no_handshake_;
    }
  }
  // Nothing buffered: the common end of every batch. Returning here, before the partial-request
  // bookkeeping below, keeps the next request from being scanned and then parsed again.
  if (size == 0) return ParseStatus::kNeedMore;
  // At the start of a request (partial_ with nothing scanned: only an empty buffer was seen).
  const bool at_request_start = !partial_ || scan_.pos == 0;
  if (*dialect_ == Dialect::kLegacy && at_request_start) {
    // A request only a torch 2.1 client sends: this connection speaks 2.1 from here on.
    const uint8_t type = data[0];
    if (type == 9 || type == 10 || type == 11 || (type == 7 && sent_other_than_type7_)) {
      dialect_ = Dialect::kV21;
    } else if (type != 7) {
      sent_other_than_type7_ = true;
    }
  }
  size_t consumed = 0;
  if (partial_) {
    // The request at the front was incomplete: resume scanning where the last attempt stopped,
    // and decode only once it is whole, so a request arriving in many pieces costs linear time.
    ParseStatus scan = scanRequest(*dialect_, limits_, data, size, &scan_, &consumed, error);
    if (scan != ParseStatus::kRequest) return scan;
  }
  ParseStatus status = parseRequest(*dialect_, limits_, data, size, out, &consumed, error);
  if (status == ParseStatus::kNeedMore && !partial_) {
    partial_ = true;
    scan_ = ScanState{};
    scanRequest(*dialect_, limits_, data, size, &scan_, &consumed, error);  // record progress
  } else if (status == ParseStatus::kRequest) {
    partial_ = false;
  }
  if (status == ParseStatus::kRequest) {
    read_pos_ += consumed;
    if (read_pos_ == buffer_.size()) {
      buffer_.clear();
      read_pos_ = 0;
    }
  }
  return status;
}

}  // namespace cpprun::rendezvous::wire
