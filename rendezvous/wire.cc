#include "rendezvous/wire.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace cpprun::rendezvous::wire {
namespace {

// Every row's type is its position, so operation(t) is an index (the X-macro keeps this true).
constexpr bool rowsInEnumOrder() {
  for (size_t i = 0; i < kQueryTypeCount; ++i) {
    if (static_cast<size_t>(kOperations[i].type) != i) return false;
  }
  return true;
}
static_assert(rowsInEnumOrder(), "kOperations rows must follow the QueryType order");

// One dialect's numbering, inverted: type_of[byte] is a QueryType (as int) or kNone.
struct ByteMap {
  int16_t type_of[256];
};

constexpr ByteMap byteMapOf(Dialect d) {
  ByteMap m{};
  for (int16_t& t : m.type_of) t = kNone;
  for (const Operation& op : kOperations) {
    const int16_t byte = op.wireByte(d);
    if (byte != kNone) m.type_of[byte] = static_cast<int16_t>(op.type);
  }
  return m;
}

// No two rows share a wire byte in one dialect, and every byte fits in the type byte.
constexpr bool numberingIsValid(Dialect d) {
  for (size_t i = 0; i < kQueryTypeCount; ++i) {
    const int16_t byte = kOperations[i].wireByte(d);
    if (byte == kNone) continue;
    if (byte < 0 || byte > 255) return false;
    for (size_t j = i + 1; j < kQueryTypeCount; ++j) {
      if (kOperations[j].wireByte(d) == byte) return false;
    }
  }
  return true;
}
static_assert(numberingIsValid(Dialect::kLegacy), "torch<=2.0 column: a byte used twice");
static_assert(numberingIsValid(Dialect::kV21), "torch 2.1 column: a byte used twice");
static_assert(numberingIsValid(Dialect::kV2), "torch>=2.2 column: a byte used twice");

constexpr ByteMap kLegacyBytes = byteMapOf(Dialect::kLegacy);
constexpr ByteMap kV21Bytes = byteMapOf(Dialect::kV21);
constexpr ByteMap kV2Bytes = byteMapOf(Dialect::kV2);

constexpr const ByteMap& byteMapFor(Dialect d) {
  switch (d) {
    case Dialect::kLegacy:
      return kLegacyBytes;
    case Dialect::kV21:
      return kV21Bytes;
    case Dialect::kV2:
      break;
  }
  return kV2Bytes;
}

// The torch 2.1 detection on connections without a handshake (see RequestDecoder): a type byte
// that 2.1 numbers and 1.13 does not (MULTI_GET, MULTI_SET, CANCEL_WAIT), or 1.13's WATCH_KEY
// byte after another request (2.1's DELETE_KEY).
constexpr bool onlyTorch21Sends(uint8_t byte) {
  return kLegacyBytes.type_of[byte] == kNone && kV21Bytes.type_of[byte] != kNone;
}
constexpr uint8_t kLegacyWatchKey = operation(QueryType::WATCH_KEY).legacy;
static_assert(onlyTorch21Sends(9) && onlyTorch21Sends(10) && onlyTorch21Sends(11) &&
                  !onlyTorch21Sends(8) && !onlyTorch21Sends(12) && kLegacyWatchKey == 7,
              "the torch 2.1 detection documented in wire.h and docs/protocol.md");

// The fields of a request after its type byte: a fixed part, then for list layouts a u64
// count and that many items. Drives parseRequest, scanRequest and encodeRequest alike.
enum class Field : uint8_t { kKey, kValue, kI64, kU32 };
struct Fields {
  Field fixed[3];
  uint8_t fixed_count;
  bool list;
  Field item[2];
  uint8_t item_count;
};

constexpr Fields fieldsOf(Layout l) {
  using F = Field;
  switch (l) {
    case Layout::kNothing:
      break;
    case Layout::kU32:
      return {{F::kU32}, 1, false, {}, 0};
    case Layout::kKey:
      return {{F::kKey}, 1, false, {}, 0};
    case Layout::kKeyValue:
      return {{F::kKey, F::kValue}, 2, false, {}, 0};
    case Layout::kKeyExpectedDesired:
      return {{F::kKey, F::kValue, F::kValue}, 3, false, {}, 0};
    case Layout::kKeyI64:
      return {{F::kKey, F::kI64}, 2, false, {}, 0};
    case Layout::kKeys:
      return {{}, 0, true, {F::kKey}, 1};
    case Layout::kKeyValuePairs:
      return {{}, 0, true, {F::kKey, F::kValue}, 2};
  }
  return {{}, 0, false, {}, 0};
}

// encodeRequest writes a list's count as the number of keys past the fixed ones, so each item
// must hold exactly one key.
constexpr bool listItemsHoldOneKey() {
  for (const Operation& op : kOperations) {
    const Fields f = fieldsOf(op.layout);
    if (!f.list) continue;
    int keys = 0;
    for (uint8_t i = 0; i < f.item_count; ++i) keys += f.item[i] == Field::kKey ? 1 : 0;
    if (keys != 1) return false;
  }
  return true;
}
static_assert(listItemsHoldOneKey(), "a list item must hold exactly one key");

// fieldsOf for every row, computed at compile time: the decoder's per-request lookup.
struct FieldsByType {
  Fields of[kQueryTypeCount];
};
constexpr FieldsByType fieldsByType() {
  FieldsByType t{};
  for (size_t i = 0; i < kQueryTypeCount; ++i) t.of[i] = fieldsOf(kOperations[i].layout);
  return t;
}
constexpr FieldsByType kFieldsByType = fieldsByType();
const Fields& fieldsOf(QueryType t) { return kFieldsByType.of[static_cast<size_t>(t)]; }

std::string unknownType(Dialect d, uint8_t byte) {
  return "unknown query type " + std::to_string(byte) + " for a " + dialectName(d) + " client";
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
  const auto i = static_cast<size_t>(t);
  return i < kQueryTypeCount ? kOperations[i].name : "?";
}

std::optional<QueryType> queryTypeFromWire(Dialect d, uint8_t byte) {
  const int16_t t = byteMapFor(d).type_of[byte];
  if (t == kNone) return std::nullopt;
  return static_cast<QueryType>(t);
}

std::optional<uint8_t> queryTypeToWire(Dialect d, QueryType t) {
  if (static_cast<size_t>(t) >= kQueryTypeCount) return std::nullopt;
  const int16_t byte = operation(t).wireByte(d);
  if (byte == kNone) return std::nullopt;
  return static_cast<uint8_t>(byte);
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
    *error = unknownType(d, data[0]);
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
  // Reads one field into its place in r; false if incomplete or (status = kError) over a limit.
  auto field = [&](Field f) -> bool {
    switch (f) {
      case Field::kKey: {
        if (key_count == r.keys.size()) r.keys.emplace_back();
        return c.lengthPrefixed(&r.keys[key_count++], limits.max_key_bytes, "key", &status, error);
      }
      case Field::kValue: {
        if (value_count == r.values.size()) r.values.emplace_back();
        return c.lengthPrefixed(&r.values[value_count++], limits.max_value_bytes, "value", &status,
                                error);
      }
      case Field::kI64: {
        uint64_t u = 0;
        if (!c.u64(&u)) return false;
        r.integer = static_cast<int64_t>(u);
        return true;
      }
      case Field::kU32:
        return c.u32(&r.u32);
    }
    return false;
  };

  const Fields& fields = fieldsOf(r.type);
  bool complete = true;
  for (uint8_t i = 0; complete && i < fields.fixed_count; ++i) complete = field(fields.fixed[i]);
  if (complete && fields.list) {
    uint64_t n = 0;
    complete = c.u64(&n);
    if (complete && n > limits.max_keys_per_request) {
      *error = tooManyKeys(n, r.type, limits.max_keys_per_request);
      return ParseStatus::kError;
    }
    for (uint64_t i = 0; complete && i < n; ++i) {
      for (uint8_t j = 0; complete && j < fields.item_count; ++j) complete = field(fields.item[j]);
    }
  }
  if (status == ParseStatus::kError) return status;
  if (!complete) return ParseStatus::kNeedMore;
  r.keys.resize(key_count);
  r.values.resize(value_count);
  *consumed = 1 + c.position();
  return ParseStatus::kRequest;
}

ParseStatus scanRequest(Dialect d, const Limits& limits, const uint8_t* data, size_t size,
                        ScanState* st, size_t* consumed, std::string* error) {
  if (st->pos == 0) {
    if (size == 0) return ParseStatus::kNeedMore;
    auto type = queryTypeFromWire(d, data[0]);
    if (!type) {
      *error = unknownType(d, data[0]);
      return ParseStatus::kError;
    }
    st->type = *type;
    st->pos = 1;
  }
  const Fields& fields = fieldsOf(st->type);
  // Skips one field; 1 = done, 0 = needs more bytes, -1 = error.
  auto skip = [&](Field f) -> int {
    size_t left = size - st->pos;
    switch (f) {
      case Field::kU32:
        if (left < 4) return 0;
        st->pos += 4;
        return 1;
      case Field::kI64:
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
  while (st->fields_done < fields.fixed_count) {
    int r = skip(fields.fixed[st->fields_done]);
    if (r <= 0) return r < 0 ? ParseStatus::kError : ParseStatus::kNeedMore;
    ++st->fields_done;
  }
  if (fields.list) {
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
      while (st->item_fields_done < fields.item_count) {
        int r = skip(fields.item[st->item_fields_done]);
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

ParseStatus parseReply(ReplyShape shape, size_t requested_keys, const uint8_t* data, size_t size,
                       uint64_t max_value_bytes, Reply* out, size_t* consumed, std::string* error) {
  // Two passes over the same fields: the first (copy = false) only checks that the whole reply
  // is there, so a reply arriving in pieces is not copied again per piece; the second copies.
  size_t pos = 0;
  bool failed = false;
  size_t values = 0;
  auto fixed = [&](size_t n) {
    if (size - pos < n) {
      *consumed = pos + n;
      return false;
    }
    pos += n;
    return true;
  };
  auto u64 = [&](uint64_t* v) {
    if (!fixed(8)) return false;
    *v = loadU64(data + pos - 8);
    return true;
  };
  auto value = [&](bool copy) {
    uint64_t len = 0;
    if (!u64(&len)) return false;
    if (len > max_value_bytes) {
      *error = "reply announces a value of " + std::to_string(len) + " bytes";
      failed = true;
      return false;
    }
    if (!fixed(static_cast<size_t>(len))) return false;
    if (copy) {
      if (values == out->values.size()) out->values.emplace_back();
      out->values[values++].assign(data + pos - len, data + pos);
    }
    return true;
  };
  auto fields = [&](bool copy) {
    uint64_t n = 0;
    switch (shape) {
      case ReplyShape::kNoReply:
        return true;
      case ReplyShape::kByte:
        if (!fixed(1)) return false;
        out->byte = data[pos - 1];
        return true;
      case ReplyShape::kU32:
        if (!fixed(4)) return false;
        out->u32 = loadU32(data + pos - 4);
        return true;
      case ReplyShape::kI64:
        if (!u64(&n)) return false;
        out->integer = static_cast<int64_t>(n);
        return true;
      case ReplyShape::kValue:
        return value(copy);
      case ReplyShape::kValues:
        for (size_t i = 0; i < requested_keys; ++i) {
          if (!value(copy)) return false;
        }
        return true;
      case ReplyShape::kCountedKeys:
        if (!u64(&n)) return false;
        if (n > max_value_bytes) {
          *error = "reply announces " + std::to_string(n) + " keys";
          failed = true;
          return false;
        }
        for (uint64_t i = 0; i < n; ++i) {
          if (!value(copy)) return false;
        }
        return true;
      case ReplyShape::kI64ThenValue:
        if (!u64(&n)) return false;
        out->integer = static_cast<int64_t>(n);
        return out->integer <= 0 || value(copy);
    }
    return false;
  };
  if (!fields(/*copy=*/false)) return failed ? ParseStatus::kError : ParseStatus::kNeedMore;
  pos = 0;
  fields(/*copy=*/true);
  out->values.resize(values);
  *consumed = pos;
  return ParseStatus::kRequest;
}

size_t replySize(ReplyShape shape, const ReplyFields& f) {
  auto items = [&f] {
    size_t n = 0;
    for (size_t i = 0; i < f.item_count; ++i) n += 8 + f.items[i].size;
    return n;
  };
  switch (shape) {
    case ReplyShape::kNoReply:
      return 0;
    case ReplyShape::kByte:
      return 1;
    case ReplyShape::kU32:
      return 4;
    case ReplyShape::kI64:
      return 8;
    case ReplyShape::kValue:
      return 8 + f.value.size;
    case ReplyShape::kValues:
      return items();
    case ReplyShape::kCountedKeys:
      return 8 + items();
    case ReplyShape::kI64ThenValue:
      return 8 + (f.integer > 0 ? 8 + f.value.size : 0);
  }
  return 0;
}

void encodeReply(ReplyShape shape, const ReplyFields& f, Bytes* out) {
  auto value = [out](ByteView v) { appendBytes(out, v.data, v.size); };
  switch (shape) {
    case ReplyShape::kNoReply:
      return;
    case ReplyShape::kByte:
      appendU8(out, f.byte);
      return;
    case ReplyShape::kU32:
      appendU32(out, f.u32);
      return;
    case ReplyShape::kI64:
      appendI64(out, f.integer);
      return;
    case ReplyShape::kValue:
      value(f.value);
      return;
    case ReplyShape::kCountedKeys:
      appendU64(out, f.item_count);
      [[fallthrough]];
    case ReplyShape::kValues:
      for (size_t i = 0; i < f.item_count; ++i) value(f.items[i]);
      return;
    case ReplyShape::kI64ThenValue:
      appendI64(out, f.integer);
      if (f.integer > 0) value(f.value);
      return;
  }
}

bool encodeRequest(Dialect d, const Request& r, Bytes* out) {
  auto type = queryTypeToWire(d, r.type);
  if (!type) return false;
  appendU8(out, *type);
  size_t key_count = 0;
  size_t value_count = 0;
  auto field = [&](Field f) {
    switch (f) {
      case Field::kKey:
        appendString(out, r.keys.at(key_count++));
        break;
      case Field::kValue:
        appendBytes(out, r.values.at(value_count++));
        break;
      case Field::kI64:
        appendI64(out, r.integer);
        break;
      case Field::kU32:
        appendU32(out, r.u32);
        break;
    }
  };
  const Fields& fields = fieldsOf(r.type);
  for (uint8_t i = 0; i < fields.fixed_count; ++i) field(fields.fixed[i]);
  if (fields.list) {
    // One key per item (static_assert above): the keys past the fixed ones are the items.
    const size_t items = r.keys.size() - key_count;
    appendU64(out, items);
    for (size_t i = 0; i < items; ++i) {
      for (uint8_t j = 0; j < fields.item_count; ++j) field(fields.item[j]);
    }
  }
  return true;
}

void RequestDecoder::clearBuffer() {
  // A connection that once sent an 8 MiB value keeps no 8 MiB buffer while it idles.
  if (buffer_.capacity() > kKeptCapacity) {
    Bytes().swap(buffer_);
  } else {
    buffer_.clear();
  }
  read_pos_ = 0;
}

void RequestDecoder::feed(const uint8_t* data, size_t size) {
  // Compact before growing so a long-lived connection's buffer stays small.
  if (read_pos_ > 0 && read_pos_ == buffer_.size()) {
    clearBuffer();
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
    if (onlyTorch21Sends(type) || (type == kLegacyWatchKey && sent_other_than_type7_)) {
      dialect_ = Dialect::kV21;
    } else if (type != kLegacyWatchKey) {
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
    if (read_pos_ == buffer_.size()) clearBuffer();
  }
  return status;
}

}  // namespace cpprun::rendezvous::wire
