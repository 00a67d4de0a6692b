// The c10d TCPStore wire codec: bytes to requests and requests/replies to bytes.
//
// Pure: no I/O, no clocks, no global state. The server feeds whatever recv() returned into a
// RequestDecoder, which copes with requests split anywhere and several requests in one chunk,
// picks the dialect of the connection from its first bytes, and enforces the size limits.
// See docs/protocol.md and ../shared/reference/tcpstore-protocol.md.
//
// Integers are little-endian (host order on every platform torch ships for), lengths u64.
// Thread safety: functions are reentrant; a RequestDecoder belongs to one connection and must
// not be used from two threads at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace cpprun::rendezvous::wire {

using Bytes = std::vector<uint8_t>;

// Which numbering of the query types a connection speaks.
enum class Dialect : uint8_t {
  kLegacy,  // torch <= 2.0 (1.13 included): no handshake, WATCH_KEY = 7, DELETE_KEY = 8
  kV2,      // torch >= 2.2: VALIDATE first, then SET = 1 ... BARRIER = 18
  kV21,     // torch 2.1: no handshake, WATCH_KEY gone: DELETE_KEY = 7 ... CANCEL_WAIT = 11
};
const char* dialectName(Dialect d);

// How a request's fields follow its type byte, and where parseRequest puts them in a Request.
// Keys fill Request::keys and values Request::values in wire order; a list is a u64 count, then
// that many items.
enum class Layout : uint8_t {
  kNothing,             // (no fields)
  kU32,                 // u32 -> u32 (VALIDATE's magic, PING's nonce)
  kKey,                 // key -> keys[0]
  kKeyValue,            // key, value -> keys[0], values[0]
  kKeyExpectedDesired,  // key, expected, desired -> keys[0], values = {expected, desired}
  kKeyI64,              // key, i64 -> keys[0], integer (ADD's delta, BARRIER's world size)
  kKeys,                // u64 n, n keys -> keys
  kKeyValuePairs,       // u64 n, n x (key, value) -> keys, values (same count)
};

// What the server sends back for a request (replies are the same in every dialect).
enum class ReplyShape : uint8_t {
  kNoReply,       // nothing
  kByte,          // one u8 enum (kCheck*, kWait*, kWatchCallbackRegistered); WAIT's and
                  // BARRIER's may come later, once the keys exist / the count is reached
  kU32,           // u32 (PING echoes its nonce)
  kI64,           // i64
  kValue,         // u64 length + bytes
  kValues,        // one value (u64 length + bytes) per requested key
  kCountedKeys,   // u64 n, then n keys
  kI64ThenValue,  // i64 n, then one value when n > 0 (QUEUE_POP: queue length, head)
};

// A query type that a dialect does not have (a hole in the wire numbering column).
constexpr int16_t kNone = -1;

// THE table of store operations: one row per query type, in the order of the QueryType enum it
// defines. Columns: PyTorch's name, its wire byte in each dialect (kNone: not in that dialect),
// the request's Layout, the reply's ReplyShape. It drives the enum, names, numbering, decoding,
// the resumable scan, encoding, the torch 2.1 detection and the client's reply decoding
// (parseReply); adding an operation is one row here, one method in StoreEngine plus its case in
// StoreEngine::handle (the compiler asks for it), and, for a client call, one TcpStoreClient
// method (see docs/architecture.md).
// clang-format off
#define CPPRUN_WIRE_OPERATIONS(X)                                                                  \
  /* QueryType   torch<=2.0 torch 2.1 torch>=2.2  request layout         reply */                  \
  X(VALIDATE,    kNone,     kNone,    0,          kU32,                 kNoReply)                  \
  X(SET,         0,         0,        1,          kKeyValue,            kNoReply)                  \
  X(COMPARE_SET, 1,         1,        2,          kKeyExpectedDesired,  kValue)                    \
  X(GET,         2,         2,        3,          kKey,                 kValue)                    \
  X(ADD,         3,         3,        4,          kKeyI64,              kI64)                      \
  X(CHECK,       4,         4,        5,          kKeys,                kByte)                     \
  X(WAIT,        5,         5,        6,          kKeys,                kByte)                     \
  X(GETNUMKEYS,  6,         6,        7,          kNothing,             kI64)                      \
  X(WATCH_KEY,   7,         kNone,    kNone,      kKey,                 kByte)                     \
  X(DELETE_KEY,  8,         7,        8,          kKey,                 kI64)                      \
  X(APPEND,      kNone,     8,        9,          kKeyValue,            kNoReply)                  \
  X(MULTI_GET,   kNone,     9,        10,         kKeys,                kValues)                   \
  X(MULTI_SET,   kNone,     10,       11,         kKeyValuePairs,       kNoReply)                  \
  X(CANCEL_WAIT, kNone,     11,       12,         kNothing,             kByte)                     \
  X(PING,        kNone,     kNone,    13,         kU32,                 kU32)                      \
  X(QUEUE_PUSH,  kNone,     kNone,    14,         kKeyValue,            kNoReply)                  \
  X(QUEUE_POP,   kNone,     kNone,    15,         kKey,                 kI64ThenValue)             \
  X(QUEUE_LEN,   kNone,     kNone,    16,         kKey,                 kI64)                      \
  X(LIST_KEYS,   kNone,     kNone,    17,         kNothing,             kCountedKeys)              \
  X(BARRIER,     kNone,     kNone,    18,         kKeyI64,              kByte)                     \
  /* cpprun's own: the job's agents authenticate (store_auth.h); far above torch's numbers */      \
  X(CPPRUN_AUTH, 96,        96,       96,         kKeyValue,            kValue)
// clang-format on

// Logical operations, spelled as in PyTorch's QueryType so they can be diffed against it.
// The numeric values here are ours (the table's row order); the wire numbers depend on the
// dialect.
enum class QueryType : uint8_t {
#define CPPRUN_WIRE_ENUMERATOR(type, legacy, v21, v2, layout, reply) type,
  CPPRUN_WIRE_OPERATIONS(CPPRUN_WIRE_ENUMERATOR)
#undef CPPRUN_WIRE_ENUMERATOR
};

// One row of the table.
struct Operation {
  QueryType type;
  const char* name;
  int16_t legacy;  // wire byte per dialect, or kNone
  int16_t v21;
  int16_t v2;
  Layout layout;
  ReplyShape reply;

  // The wire byte in `d`, or kNone.
  constexpr int16_t wireByte(Dialect d) const {
    switch (d) {
      case Dialect::kLegacy:
        return legacy;
      case Dialect::kV21:
        return v21;
      case Dialect::kV2:
        return v2;
    }
    return kNone;
  }
};

inline constexpr Operation kOperations[] = {
#define CPPRUN_WIRE_ROW(type, legacy, v21, v2, layout, reply) \
  {QueryType::type, #type, legacy, v21, v2, Layout::layout, ReplyShape::reply},
    CPPRUN_WIRE_OPERATIONS(CPPRUN_WIRE_ROW)
#undef CPPRUN_WIRE_ROW
};
inline constexpr size_t kQueryTypeCount = sizeof(kOperations) / sizeof(kOperations[0]);

// The row of `t`. REQUIRES: t is a QueryType value (one of the table's rows).
constexpr const Operation& operation(QueryType t) { return kOperations[static_cast<size_t>(t)]; }

const char* queryTypeName(QueryType t);

std::optional<QueryType> queryTypeFromWire(Dialect d, uint8_t byte);
std::optional<uint8_t> queryTypeToWire(Dialect d, QueryType t);

// Reply enums (unchanged across versions).
constexpr uint8_t kCheckReady = 0;
constexpr uint8_t kCheckNotReady = 1;
constexpr uint8_t kWaitStopWaiting = 0;
constexpr uint8_t kWaitCanceled = 1;
constexpr uint8_t kWatchKeyUpdated = 0;
constexpr uint8_t kWatchKeyCreated = 1;
constexpr uint8_t kWatchKeyDeleted = 2;
constexpr uint8_t kWatchCallbackRegistered = 3;

// VALIDATE's magic, sent by torch >= 2.2 clients right after connecting.
constexpr uint32_t kValidationMagic = 0x3C85F7CE;

// Per-request limits. The defaults are PyTorch's (libuv server).
struct Limits {
  size_t max_key_bytes = 8 * 1024;
  size_t max_value_bytes = 8 * 1024 * 1024;
  size_t max_keys_per_request = 128 * 1024;
};

// One decoded request. Which fields are meaningful depends on `type`: its row's Layout says
// (e.g. COMPARE_SET: keys[0], values = {expected, desired}; ADD: keys[0], integer = delta).
struct Request {
  QueryType type = QueryType::GETNUMKEYS;
  std::vector<std::string> keys;
  std::vector<Bytes> values;
  int64_t integer = 0;
  uint32_t u32 = 0;

  bool operator==(const Request& o) const {
    return type == o.type && keys == o.keys && values == o.values && integer == o.integer &&
           u32 == o.u32;
  }
};

enum class ParseStatus {
  kRequest,   // a whole request was decoded
  kNeedMore,  // the bytes so far are a valid prefix; nothing was consumed
  kError,     // malformed, unknown type, or over a limit; the connection must be closed
};

// One decoded reply. Its ReplyShape says which fields hold it: kByte -> byte, kU32 -> u32,
// kI64 -> integer, kValue -> values[0], kValues -> values (one per requested key),
// kCountedKeys -> values (the keys), kI64ThenValue -> integer, and values[0] when integer > 0.
struct Reply {
  uint8_t byte = 0;
  uint32_t u32 = 0;
  int64_t integer = 0;
  std::vector<Bytes> values;
};

// Decodes one reply of `shape` (to a request that named `requested_keys` keys: kValues has one
// value per key) from the front of [data, data + size). kRequest fills *out and sets *consumed
// to its length; kNeedMore sets *consumed to how many bytes the reply needs at least (ask again
// when they are there: more may be needed); kError (a value or key count over `max_value_bytes`)
// says why in *error. Nothing is copied until the whole reply is there. *out's buffers are reused.
ParseStatus parseReply(ReplyShape shape, size_t requested_keys, const uint8_t* data, size_t size,
                       uint64_t max_value_bytes, Reply* out, size_t* consumed, std::string* error);

// Bytes borrowed from a value or a key, for encodeReply.
struct ByteView {
  const uint8_t* data = nullptr;
  size_t size = 0;
  ByteView() = default;
  ByteView(const Bytes& b) : data(b.data()), size(b.size()) {}  // NOLINT: implicit on purpose
  ByteView(const std::string& s)                                // NOLINT: implicit on purpose
      : data(reinterpret_cast<const uint8_t*>(s.data())), size(s.size()) {}
};

// The fields of a reply to encode, borrowed (nothing is copied until encodeReply appends it).
// Which fields a shape reads is as in Reply: kByte -> byte, kU32 -> u32, kI64 -> integer,
// kValue -> value, kValues -> items (one per requested key; an absent key's item is empty),
// kCountedKeys -> items (the keys; their count goes first), kI64ThenValue -> integer, and value
// when integer > 0. The of* functions fill one shape's fields.
struct ReplyFields {
  uint8_t byte = 0;
  uint32_t u32 = 0;
  int64_t integer = 0;
  ByteView value;
  const ByteView* items = nullptr;  // item_count of them
  size_t item_count = 0;

  static ReplyFields ofByte(uint8_t v) {
    ReplyFields f;
    f.byte = v;
    return f;
  }
  static ReplyFields ofU32(uint32_t v) {
    ReplyFields f;
    f.u32 = v;
    return f;
  }
  static ReplyFields ofInteger(int64_t v, ByteView then = {}) {
    ReplyFields f;
    f.integer = v;
    f.value = then;
    return f;
  }
  static ReplyFields ofValue(ByteView v) {
    ReplyFields f;
    f.value = v;
    return f;
  }
  static ReplyFields ofItems(const std::vector<ByteView>& items) {
    ReplyFields f;
    f.items = items.data();
    f.item_count = items.size();
    return f;
  }
};

// The encoder that parseReply reads back, driven by the same ReplyShape column: the server
// answers every operation through it, in the shape operation(type).reply names. replySize is
// the number of bytes encodeReply appends (0 for kNoReply), so a server can hold a reply's size
// against a budget before building it.
size_t replySize(ReplyShape shape, const ReplyFields& fields);
void encodeReply(ReplyShape shape, const ReplyFields& fields, Bytes* out);

// Decodes one request of dialect `d` from the front of [data, data + size).
// On kRequest fills *out and sets *consumed; on kError sets *error to a readable reason; on
// kNeedMore and kError *out holds partial contents. *out's buffers are reused, so decoding
// into the same Request again allocates nothing once it has grown.
ParseStatus parseRequest(Dialect d, const Limits& limits, const uint8_t* data, size_t size,
                         Request* out, size_t* consumed, std::string* error);

// Progress of a resumable scan over one request (see scanRequest).
struct ScanState {
  size_t pos = 0;  // bytes of the request fully scanned (0: not started)
  QueryType type = QueryType::GETNUMKEYS;
  uint8_t fields_done = 0;  // of the fixed fields
  bool counted = false;     // list requests: the key count was read
  uint64_t items_left = 0;
  uint8_t item_fields_done = 0;
};

// Checks, without copying anything, whether [data, data + size) starts with a whole request,
// resuming from *state (start with a default ScanState, and pass the same bytes plus any that
// arrived since). kRequest sets *consumed to its length; kError says why it is malformed.
ParseStatus scanRequest(Dialect d, const Limits& limits, const uint8_t* data, size_t size,
                        ScanState* state, size_t* consumed, std::string* error);

// Appends the wire form of `r` in dialect `d`. Returns false when `d` has no such query type
// (e.g. APPEND in the legacy dialect) and appends nothing.
bool encodeRequest(Dialect d, const Request& r, Bytes* out);

// Incremental decoder for one connection: feed() what arrives, then call next() until it says
// kNeedMore (wait for more bytes) or kError (close). Detects the dialect from the first bytes:
// `00 ce f7 85 3c` (VALIDATE) means a torch >= 2.2 client, anything else a client without a
// handshake, read in `no_handshake` numbering. The VALIDATE request itself is returned like any
// other so the server can count it.
//
// torch 1.13 and 2.1 clients cannot be told apart by their first bytes (neither has a
// handshake; both number SET ... GETNUMKEYS 0 ... 6). With `no_handshake` = kLegacy a
// connection is read in 1.13 numbering until it sends what only a 2.1 client sends, and in 2.1
// numbering from that request on (see docs/protocol.md, "torch 2.1 clients"):
//   - a request of type 9, 10 or 11 (2.1 MULTI_GET, MULTI_SET, CANCEL_WAIT; 1.13 has no such
//     types and its server closed the connection on them), or
//   - a request of type 7 after a request that was not type 7 (1.13 sends 7 = WATCH_KEY only
//     on its callback connection, which carries nothing else; 2.1 sends 7 = DELETE_KEY).
// Still read as 1.13: a 2.1 delete_key that is its connection's first request (WATCH_KEY) and
// a 2.1 append before any of the above (DELETE_KEY). `no_handshake` = kV21 reads every such
// connection as 2.1 from its first byte.
class RequestDecoder {
 public:
  explicit RequestDecoder(Limits limits, Dialect no_handshake = Dialect::kLegacy)
      : limits_(limits), no_handshake_(no_handshake) {}

  void feed(const uint8_t* data, size_t size);
  ParseStatus next(Request* out, std::string* error);

  // Empty until the first bytes decided it.
  std::optional<Dialect> dialect() const { return dialect_; }
  // Bytes received but not yet decoded (a partial request).
  size_t bufferedBytes() const { return buffer_.size() - read_pos_; }
  // The type of the partial request, once next() has seen its first byte and said kNeedMore.
  std::optional<QueryType> partialType() const {
    if (!partial_ || scan_.pos == 0) return std::nullopt;
    return scan_.type;
  }

 private:
  void clearBuffer();  // empties the buffer; frees it when it grew past kKeptCapacity
  static constexpr size_t kKeptCapacity = 256 * 1024;

  Limits limits_;
  Dialect no_handshake_;
  std::optional<Dialect> dialect_;
  bool sent_other_than_type7_ = false;  // legacy connections: for the 2.1 switch
  Bytes buffer_;
  size_t read_pos_ = 0;
  bool partial_ = false;  // the request at read_pos_ was found incomplete
  ScanState scan_;        // how far it has been scanned
};

// Encoding helpers shared by the server (replies) and the client (requests).
void appendU8(Bytes* out, uint8_t v);
void appendU32(Bytes* out, uint32_t v);
void appendI64(Bytes* out, int64_t v);
void appendU64(Bytes* out, uint64_t v);
void appendString(Bytes* out, const std::string& s);  // u64 length + bytes
void appendBytes(Bytes* out, const Bytes& b);         // u64 length + bytes
void appendBytes(Bytes* out, const uint8_t* data, size_t size);

uint64_t loadU64(const uint8_t* p);

// ADD and BARRIER keep counters as decimal text. Parses one as torch does (std::stoll: leading
// blanks and a sign allowed, trailing text ignored, at least one digit); false if it is not one.
bool parseCounter(const Bytes& value, int64_t* out);
Bytes formatCounter(int64_t value);
uint32_t loadU32(const uint8_t* p);

}  // namespace cpprun::rendezvous::wire
