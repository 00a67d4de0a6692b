// The codec: every query type in both dialects, exact bytes, split and pipelined input, limits,
// and dialect detection.
#include "rendezvous/wire.h"

#include <catch2/catch.hpp>
#include <map>
#include <random>

#include "rendezvous/store_engine.h"
#include "tests/support/test_support.h"

namespace {

using namespace cpprun::rendezvous::wire;
using cpprun::testing::fromHex;
using cpprun::testing::toHex;

Bytes b(const std::string& s) { return cpprun::testing::bytesOf(s); }

// One representative request of every type.
std::vector<Request> sampleRequests() {
  std::vector<Request> v;
  auto make = [&](QueryType t, std::vector<std::string> keys, std::vector<Bytes> values,
                  int64_t integer = 0, uint32_t u32 = 0) {
    v.push_back(cpprun::testing::makeRequest(t, std::move(keys), std::move(values), integer, u32));
  };
  make(QueryType::VALIDATE, {}, {}, 0, kValidationMagic);
  make(QueryType::SET, {"/key1"}, {b("value1")});
  make(QueryType::SET, {"/empty"}, {Bytes{}});
  make(QueryType::COMPARE_SET, {"/cas"}, {b("old"), b("new")});
  make(QueryType::GET, {"/key1"}, {});
  make(QueryType::ADD, {"init/"}, {}, -2);
  make(QueryType::CHECK, {"/a", "/b"}, {});
  make(QueryType::WAIT, {"/a"}, {});
  make(QueryType::WAIT, {}, {});
  make(QueryType::GETNUMKEYS, {}, {});
  make(QueryType::WATCH_KEY, {"/watched"}, {});
  make(QueryType::DELETE_KEY, {"/key1"}, {});
  make(QueryType::APPEND, {"/log"}, {b("line\n")});
  make(QueryType::MULTI_GET, {"/a", "/b", "/c"}, {});
  make(QueryType::MULTI_SET, {"/a", "/b"}, {b("1"), b("22")});
  make(QueryType::CANCEL_WAIT, {}, {});
  make(QueryType::PING, {}, {}, 0, 0x1092d);
  make(QueryType::QUEUE_PUSH, {"/q"}, {b("item")});
  make(QueryType::QUEUE_POP, {"/q"}, {});
  make(QueryType::QUEUE_LEN, {"/q"}, {});
  make(QueryType::LIST_KEYS, {}, {});
  make(QueryType::BARRIER, {"/barrier"}, {}, 8);
  return v;
}

std::vector<Request> samplesFor(Dialect d) {
  std::vector<Request> out;
  for (auto& r : sampleRequests()) {
    if (queryTypeToWire(d, r.type)) out.push_back(r);
  }
  return out;
}

Bytes encode(Dialect d, const Request& r) {
  Bytes out;
  REQUIRE(encodeRequest(d, r, &out));
  return out;
}

// Decodes everything in `bytes`, feeding it in pieces cut at `cuts`.
std::vector<Request> decodeAll(const Bytes& bytes, const std::vector<size_t>& cuts,
                               std::optional<Dialect>* dialect = nullptr) {
  RequestDecoder decoder{Limits{}};
  std::vector<Request> out;
  size_t start = 0;
  auto drain = [&] {
    Request r;
    std::string error;
    while (true) {
      auto s = decoder.next(&r, &error);
      REQUIRE(s != ParseStatus::kError);
      if (s == ParseStatus::kNeedMore) break;
      out.push_back(r);
    }
  };
  for (size_t cut : cuts) {
    decoder.feed(bytes.data() + start, cut - start);
    drain();
    start = cut;
  }
  decoder.feed(bytes.data() + start, bytes.size() - start);
  drain();
  CHECK(decoder.bufferedBytes() == 0);
  if (dialect) *dialect = decoder.dialect();
  return out;
}

}  // namespace

TEST_CASE("wire numbers follow torch's tables", "[unit]") {
  // torch <= 2.0
  CHECK(queryTypeFromWire(Dialect::kLegacy, 0) == QueryType::SET);
  CHECK(queryTypeFromWire(Dialect::kLegacy, 6) == QueryType::GETNUMKEYS);
  CHECK(queryTypeFromWire(Dialect::kLegacy, 7) == QueryType::WATCH_KEY);
  CHECK(queryTypeFromWire(Dialect::kLegacy, 8) == QueryType::DELETE_KEY);
  CHECK_FALSE(queryTypeFromWire(Dialect::kLegacy, 9));
  CHECK_FALSE(queryTypeToWire(Dialect::kLegacy, QueryType::APPEND));
  CHECK_FALSE(queryTypeToWire(Dialect::kLegacy, QueryType::VALIDATE));
  // torch >= 2.2
  const QueryType v2[] = {
      QueryType::VALIDATE,    QueryType::SET,       QueryType::COMPARE_SET, QueryType::GET,
      QueryType::ADD,         QueryType::CHECK,     QueryType::WAIT,        QueryType::GETNUMKEYS,
      QueryType::DELETE_KEY,  QueryType::APPEND,    QueryType::MULTI_GET,   QueryType::MULTI_SET,
      QueryType::CANCEL_WAIT, QueryType::PING,      QueryType::QUEUE_PUSH,  QueryType::QUEUE_POP,
      QueryType::QUEUE_LEN,   QueryType::LIST_KEYS, QueryType::BARRIER};
  for (uint8_t i = 0; i < 19; ++i) {
    CHECK(queryTypeFromWire(Dialect::kV2, i) == v2[i]);
    CHECK(queryTypeToWire(Dialect::kV2, v2[i]) == i);
  }
  CHECK_FALSE(queryTypeFromWire(Dialect::kV2, 19));
  CHECK_FALSE(queryTypeToWire(Dialect::kV2, QueryType::WATCH_KEY));
}

TEST_CASE("legacy requests encode to the bytes torch 1.13 sent", "[unit]") {
  Request set;
  set.type = QueryType::SET;
  set.keys = {"/key1"};
  set.values = {b("value1")};
  CHECK(toHex(encode(Dialect::kLegacy, set)) ==
        "0005000000000000002f6b657931060000000000000076616c756531");
  Request add;
  add.type = QueryType::ADD;
  add.keys = {"/counter"};
  add.integer = -2;
  CHECK(toHex(encode(Dialect::kLegacy, add)) ==
        "0308000000000000002f636f756e746572feffffffffffffff");
  Request wait;
  wait.type = QueryType::WAIT;
  wait.keys = {"/key1", "/counter"};
  CHECK(toHex(encode(Dialect::kLegacy, wait)) ==
        "05020000000000000005000000000000002f6b6579310800000000000000"
        "2f636f756e746572");
}

TEST_CASE("torch >= 2.2 requests encode to the reference's bytes", "[unit]") {
  Request validate;
  validate.type = QueryType::VALIDATE;
  validate.u32 = kValidationMagic;
  CHECK(toHex(encode(Dialect::kV2, validate)) == "00cef7853c");
  Request ping;
  ping.type = QueryType::PING;
  ping.u32 = 0x1092d;
  CHECK(toHex(encode(Dialect::kV2, ping)) == "0d2d090100");
  Request set;
  set.type = QueryType::SET;
  set.keys = {"/k"};
  set.values = {b("v")};
  CHECK(toHex(encode(Dialect::kV2, set)) == "0102000000000000002f6b010000000000000076");
  Request del;
  del.type = QueryType::DELETE_KEY;
  del.keys = {"/k"};
  CHECK(toHex(encode(Dialect::kV2, del)) == "0802000000000000002f6b");
  Request multi_set;
  multi_set.type = QueryType::MULTI_SET;
  multi_set.keys = {"a"};
  multi_set.values = {b("b")};
  CHECK(toHex(encode(Dialect::kV2, multi_set)) ==
        "0b"
        "0100000000000000"
        "0100000000000000"
        "61"
        "0100000000000000"
        "62");
  Request cancel;
  cancel.type = QueryType::CANCEL_WAIT;
  CHECK(toHex(encode(Dialect::kV2, cancel)) == "0c");
  Request barrier;
  barrier.type = QueryType::BARRIER;
  barrier.keys = {"b"};
  barrier.integer = 2;
  CHECK(toHex(encode(Dialect::kV2, barrier)) == "120100000000000000620200000000000000");
}

TEST_CASE("every query type round-trips in both dialects", "[unit]") {
  for (Dialect d : {Dialect::kLegacy, Dialect::kV2}) {
    for (const auto& r : samplesFor(d)) {
      INFO(dialectName(d) << " " << queryTypeName(r.type));
      Bytes bytes = encode(d, r);
      Request out;
      size_t consumed = 0;
      std::string error;
      REQUIRE(parseRequest(d, Limits{}, bytes.data(), bytes.size(), &out, &consumed, &error) ==
              ParseStatus::kRequest);
      CHECK(consumed == bytes.size());
      CHECK(out == r);
      size_t scanned = 0;
      ScanState fresh;
      CHECK(scanRequest(d, Limits{}, bytes.data(), bytes.size(), &fresh, &scanned, &error) ==
            ParseStatus::kRequest);
      CHECK(scanned == bytes.size());
      // Resumed byte by byte, the scan finds the same end.
      ScanState resumed;
      for (size_t n = 0; n < bytes.size(); ++n) {
        REQUIRE(scanRequest(d, Limits{}, bytes.data(), n, &resumed, &scanned, &error) ==
                ParseStatus::kNeedMore);
      }
      CHECK(scanRequest(d, Limits{}, bytes.data(), bytes.size(), &resumed, &scanned, &error) ==
            ParseStatus::kRequest);
      CHECK(scanned == bytes.size());
      // Every strict prefix is incomplete, never an error, and consumes nothing.
      for (size_t n = 0; n < bytes.size(); ++n) {
        consumed = 0;
        CHECK(parseRequest(d, Limits{}, bytes.data(), n, &out, &consumed, &error) ==
              ParseStatus::kNeedMore);
        CHECK(consumed == 0);
      }
    }
  }
}

namespace {

// A request of `op`'s type with every field of its layout filled (lists with two items).
Request sampleOf(const Operation& op) {
  Request r;
  r.type = op.type;
  switch (op.layout) {
    case Layout::kNothing:
      break;
    case Layout::kU32:
      r.u32 = kValidationMagic;
      break;
    case Layout::kKey:
      r.keys = {"/k"};
      break;
    case Layout::kKeyValue:
      r.keys = {"/k"};
      r.values = {b("value")};
      break;
    case Layout::kKeyExpectedDesired:
      r.keys = {"/k"};
      r.values = {b("1"), b("22")};
      break;
    case Layout::kKeyI64:
      r.keys = {"/k"};
      r.integer = -3;
      break;
    case Layout::kKeys:
      r.keys = {"/a", "/b"};
      break;
    case Layout::kKeyValuePairs:
      r.keys = {"/a", "/b"};
      r.values = {b("1"), b("22")};
      break;
  }
  return r;
}

}  // namespace

TEST_CASE("every row of the operation table round-trips in each dialect it exists in", "[unit]") {
  CHECK(kQueryTypeCount == 21);  // torch's 20 and CPPRUN_AUTH (store_auth.h)
  for (const Operation& op : kOperations) {
    INFO(op.name);
    CHECK(std::string(queryTypeName(op.type)) == op.name);
    const Request sample = sampleOf(op);
    int dialects = 0;
    for (Dialect d : {Dialect::kLegacy, Dialect::kV21, Dialect::kV2}) {
      INFO(dialectName(d));
      Bytes bytes;
      if (op.wireByte(d) == kNone) {
        // Not in this dialect: no number either way, and nothing is written.
        CHECK_FALSE(queryTypeToWire(d, op.type));
        CHECK_FALSE(encodeRequest(d, sample, &bytes));
        CHECK(bytes.empty());
        continue;
      }
      ++dialects;
      REQUIRE(queryTypeFromWire(d, static_cast<uint8_t>(op.wireByte(d))) == op.type);
      REQUIRE(queryTypeToWire(d, op.type) == op.wireByte(d));
      // parse(encode(request)) == request
      REQUIRE(encodeRequest(d, sample, &bytes));
      REQUIRE(bytes.size() > 0);
      CHECK(bytes[0] == op.wireByte(d));
      Request parsed;
      size_t consumed = 0;
      std::string error;
      REQUIRE(parseRequest(d, Limits{}, bytes.data(), bytes.size(), &parsed, &consumed, &error) ==
              ParseStatus::kRequest);
      CHECK(consumed == bytes.size());
      CHECK(parsed == sample);
      // encode(parse(bytes)) == bytes, with trailing bytes of a next request left alone.
      Bytes pipelined = bytes;
      pipelined.push_back(0xff);
      REQUIRE(parseRequest(d, Limits{}, pipelined.data(), pipelined.size(), &parsed, &consumed,
                           &error) == ParseStatus::kRequest);
      CHECK(consumed == bytes.size());
      Bytes again;
      REQUIRE(encodeRequest(d, parsed, &again));
      CHECK(again == bytes);
      // The resumable scan, fed a byte at a time, ends where the parse did.
      ScanState scan;
      size_t scanned = 0;
      for (size_t n = 0; n < bytes.size(); ++n) {
        REQUIRE(scanRequest(d, Limits{}, bytes.data(), n, &scan, &scanned, &error) ==
                ParseStatus::kNeedMore);
      }
      REQUIRE(scanRequest(d, Limits{}, bytes.data(), bytes.size(), &scan, &scanned, &error) ==
              ParseStatus::kRequest);
      CHECK(scanned == bytes.size());
      // A decoder of a connection in this dialect returns it whole, however it is cut.
      Bytes stream;
      if (d == Dialect::kV2 && op.type != QueryType::VALIDATE) {
        Request validate = sampleOf(operation(QueryType::VALIDATE));
        REQUIRE(encodeRequest(Dialect::kV2, validate, &stream));
      }
      const size_t handshake = stream.size();
      stream.insert(stream.end(), bytes.begin(), bytes.end());
      RequestDecoder decoder(Limits{}, d == Dialect::kV2 ? Dialect::kLegacy : d);
      std::vector<Request> decoded;
      for (size_t i = 0; i < stream.size(); ++i) {
        decoder.feed(&stream[i], 1);
        Request r;
        ParseStatus s;
        while ((s = decoder.next(&r, &error)) == ParseStatus::kRequest) decoded.push_back(r);
        REQUIRE(s == ParseStatus::kNeedMore);
      }
      REQUIRE(decoded.size() == (handshake > 0 ? 2u : 1u));
      CHECK(decoded.back() == sample);
      CHECK(decoder.dialect() == d);
    }
    CHECK(dialects > 0);  // a row no dialect numbers is dead
  }
}

TEST_CASE("every row's reply has the shape the operation table gives it", "[unit]") {
  class Recording : public cpprun::rendezvous::Outbox {
   public:
    void send(cpprun::rendezvous::ClientId client, const uint8_t* data, size_t size) override {
      sent[client].insert(sent[client].end(), data, data + size);
    }
    std::map<cpprun::rendezvous::ClientId, Bytes> sent;
  };
  for (const Operation& op : kOperations) {
    INFO(op.name);
    Recording outbox;
    cpprun::rendezvous::StoreEngine engine(&outbox);
    // Every key the samples name holds a counter, so WAIT, CHECK and BARRIER answer at once.
    for (const char* key : {"/k", "/a", "/b"}) engine.localSet(key, b("1"));
    const Dialect d = op.wireByte(Dialect::kV2) != kNone ? Dialect::kV2 : Dialect::kLegacy;
    const Request r = sampleOf(op);
    std::string error;
    REQUIRE(engine.handle(1, d, r, &error));
    const Bytes& reply = outbox.sent[1];
    if (op.reply == ReplyShape::kNoReply) {
      CHECK(reply.empty());
    } else {
      REQUIRE_FALSE(reply.empty());
    }
    // The client's decoder, driven by the same column, reads exactly these bytes as one reply,
    // and asks for more (never past the end) while any are missing.
    Reply decoded;
    size_t consumed = 0;
    for (size_t n = 0; n < reply.size(); ++n) {
      REQUIRE(parseReply(op.reply, r.keys.size(), reply.data(), n, 1 << 20, &decoded, &consumed,
                         &error) == ParseStatus::kNeedMore);
      CHECK(consumed > n);
      CHECK(consumed <= reply.size());
    }
    REQUIRE(parseReply(op.reply, r.keys.size(), reply.data(), reply.size(), 1 << 20, &decoded,
                       &consumed, &error) == ParseStatus::kRequest);
    CHECK(consumed == reply.size());
  }
}

TEST_CASE("encodeReply's bytes read back by parseReply for every row's shape in every dialect",
          "[unit]") {
  const Bytes value = b("hello");
  const Bytes empty;
  const std::string key = "/some/key";
  const std::vector<ByteView> items = {value, empty, key};
  const Dialect dialects[] = {Dialect::kLegacy, Dialect::kV21, Dialect::kV2};
  for (const Operation& op : kOperations) {
    for (Dialect d : dialects) {
      if (op.wireByte(d) == kNone) continue;
      INFO(op.name << " in " << dialectName(d));
      // Samples of each shape's fields, the edge cases included (an empty value, no items, a
      // queue length of 0 without a value, negative integers).
      std::vector<ReplyFields> samples = {
          ReplyFields::ofByte(0),         ReplyFields::ofByte(3),
          ReplyFields::ofU32(0x3C85F7CE), ReplyFields::ofInteger(-7),
          ReplyFields::ofInteger(0),      ReplyFields::ofInteger(2, value),
          ReplyFields::ofValue(value),    ReplyFields::ofValue(empty),
          ReplyFields::ofItems(items),    ReplyFields::ofItems({})};
      for (const ReplyFields& f : samples) {
        Bytes bytes = {0xee};  // appends: what was there stays
        encodeReply(op.reply, f, &bytes);
        REQUIRE(bytes.size() == 1 + replySize(op.reply, f));
        CHECK(bytes[0] == 0xee);
        const size_t requested = op.reply == ReplyShape::kValues ? f.item_count : 1;
        Reply r;
        size_t consumed = 0;
        std::string error;
        if (op.reply == ReplyShape::kNoReply) {
          CHECK(bytes.size() == 1);
          continue;
        }
        REQUIRE(parseReply(op.reply, requested, bytes.data() + 1, bytes.size() - 1, 1 << 20, &r,
                           &consumed, &error) == ParseStatus::kRequest);
        CHECK(consumed == bytes.size() - 1);
        auto same = [](const Bytes& got, ByteView want) {
          return got == Bytes(want.data, want.data + want.size);
        };
        switch (op.reply) {
          case ReplyShape::kNoReply:
            break;
          case ReplyShape::kByte:
            CHECK(r.byte == f.byte);
            break;
          case ReplyShape::kU32:
            CHECK(r.u32 == f.u32);
            break;
          case ReplyShape::kI64:
            CHECK(r.integer == f.integer);
            break;
          case ReplyShape::kValue:
            REQUIRE(r.values.size() == 1);
            CHECK(same(r.values[0], f.value));
            break;
          case ReplyShape::kValues:
          case ReplyShape::kCountedKeys:
            REQUIRE(r.values.size() == f.item_count);
            for (size_t i = 0; i < f.item_count; ++i) CHECK(same(r.values[i], f.items[i]));
            break;
          case ReplyShape::kI64ThenValue:
            CHECK(r.integer == f.integer);
            REQUIRE(r.values.size() == (f.integer > 0 ? 1u : 0u));
            if (f.integer > 0) CHECK(same(r.values[0], f.value));
            break;
        }
      }
    }
  }
}

TEST_CASE("encodeReply writes the bytes torch's servers send", "[unit]") {
  auto encoded = [](ReplyShape shape, const ReplyFields& f) {
    Bytes out;
    encodeReply(shape, f, &out);
    return toHex(out);
  };
  const Bytes value = b("ab");
  const std::string key = "k";
  CHECK(encoded(ReplyShape::kNoReply, ReplyFields::ofByte(1)) == "");
  CHECK(encoded(ReplyShape::kByte, ReplyFields::ofByte(1)) == "01");
  CHECK(encoded(ReplyShape::kU32, ReplyFields::ofU32(0x01020304)) == "04030201");
  CHECK(encoded(ReplyShape::kI64, ReplyFields::ofInteger(-1)) == "ffffffffffffffff");
  CHECK(encoded(ReplyShape::kValue, ReplyFields::ofValue(value)) == "02000000000000006162");
  CHECK(encoded(ReplyShape::kValues, ReplyFields::ofItems({value, Bytes{}})) ==
        "020000000000000061620000000000000000");
  CHECK(encoded(ReplyShape::kCountedKeys, ReplyFields::ofItems({key})) ==
        "010000000000000001000000000000006b");
  CHECK(encoded(ReplyShape::kI64ThenValue, ReplyFields::ofInteger(0, value)) == "0000000000000000");
  CHECK(encoded(ReplyShape::kI64ThenValue, ReplyFields::ofInteger(3, value)) ==
        "030000000000000002000000000000006162");
}

TEST_CASE("parseReply fills the fields its shape names", "[unit]") {
  Reply r;
  size_t consumed = 0;
  std::string error;
  Bytes bytes;
  appendBytes(&bytes, b("ab"));
  appendBytes(&bytes, b(""));
  appendBytes(&bytes, b("xyz"));
  bytes.push_back(0xee);  // the next reply's first byte: left alone
  REQUIRE(parseReply(ReplyShape::kValues, 3, bytes.data(), bytes.size(), 100, &r, &consumed,
                     &error) == ParseStatus::kRequest);
  CHECK(consumed == bytes.size() - 1);
  CHECK(r.values == std::vector<Bytes>{b("ab"), b(""), b("xyz")});
  // The same buffers, reused for a shorter reply.
  REQUIRE(parseReply(ReplyShape::kCountedKeys, 0, bytes.data(), 8, 100, &r, &consumed, &error) ==
          ParseStatus::kNeedMore);
  Bytes keys;
  appendU64(&keys, 1);
  appendString(&keys, "/k");
  REQUIRE(parseReply(ReplyShape::kCountedKeys, 0, keys.data(), keys.size(), 100, &r, &consumed,
                     &error) == ParseStatus::kRequest);
  CHECK(r.values == std::vector<Bytes>{b("/k")});
  Bytes pop;
  appendI64(&pop, 0);  // an empty queue: no value follows
  REQUIRE(parseReply(ReplyShape::kI64ThenValue, 1, pop.data(), pop.size(), 100, &r, &consumed,
                     &error) == ParseStatus::kRequest);
  CHECK(r.integer == 0);
  CHECK(r.values.empty());
  Bytes u32;
  appendU32(&u32, 0xdeadbeef);
  REQUIRE(parseReply(ReplyShape::kU32, 0, u32.data(), u32.size(), 100, &r, &consumed, &error) ==
          ParseStatus::kRequest);
  CHECK(r.u32 == 0xdeadbeef);
  // A length over the bound is an error, named, before any of it is awaited.
  Bytes huge;
  appendU64(&huge, 101);
  CHECK(parseReply(ReplyShape::kValue, 1, huge.data(), huge.size(), 100, &r, &consumed, &error) ==
        ParseStatus::kError);
  CHECK(error == "reply announces a value of 101 bytes");
}

TEST_CASE("the decoder handles byte-by-byte and random splits and pipelined input", "[unit]") {
  for (Dialect d : {Dialect::kLegacy, Dialect::kV2}) {
    auto requests = samplesFor(d);
    if (d == Dialect::kLegacy) {
      // A legacy stream cannot begin with 00 + the magic, and a type 7 after other requests
      // is torch 2.1's DELETE_KEY (1.13 sends WATCH_KEY only on its callback connection): start
      // with WATCH_KEY.
      auto watch = std::find_if(requests.begin(), requests.end(),
                                [](const Request& r) { return r.type == QueryType::WATCH_KEY; });
      std::rotate(requests.begin(), watch, requests.end());
    }
    Bytes stream;
    for (const auto& r : requests) {
      Bytes one = encode(d, r);
      stream.insert(stream.end(), one.begin(), one.end());
    }
    INFO(dialectName(d));
    std::optional<Dialect> detected;
    // All in one chunk (pipelined).
    CHECK(decodeAll(stream, {}, &detected) == requests);
    CHECK(detected == d);
    // One byte at a time.
    {
      std::vector<size_t> cuts;
      for (size_t i = 1; i < stream.size(); ++i) cuts.push_back(i);
      CHECK(decodeAll(stream, cuts, &detected) == requests);
    }
    // Random splits.
    {
      std::mt19937 rng(42);
      for (int round = 0; round < 50; ++round) {
        std::vector<size_t> cuts;
        std::uniform_int_distribution<size_t> pick(1, stream.size() - 1);
        for (int i = 0; i < 6; ++i) cuts.push_back(pick(rng));
        std::sort(cuts.begin(), cuts.end());
        cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
        REQUIRE(decodeAll(stream, cuts, &detected) == requests);
      }
    }
    CHECK(detected == d);
  }
}

TEST_CASE("the dialect comes from the first bytes", "[unit]") {
  auto detect = [](const std::string& hex) {
    RequestDecoder decoder{Limits{}};
    Bytes bytes = fromHex(hex);
    decoder.feed(bytes.data(), bytes.size());
    Request r;
    std::string error;
    decoder.next(&r, &error);
    return decoder.dialect();
  };
  CHECK(detect("00cef7853c") == Dialect::kV2);
  CHECK(detect("00cef785") == std::nullopt);  // not enough bytes to tell yet
  CHECK(detect("00") == std::nullopt);
  CHECK(detect("0005000000000000002f6b657931") == Dialect::kLegacy);  // a 1.13 SET
  CHECK(detect("030500000000000000696e69742f") == Dialect::kLegacy);  // a 1.13 ADD init/
  CHECK(detect("06") == Dialect::kLegacy);
}

TEST_CASE("malformed input and limits are errors with a reason", "[unit]") {
  Limits limits;
  limits.max_key_bytes = 16;
  limits.max_value_bytes = 32;
  limits.max_keys_per_request = 4;
  auto parse = [&](Dialect d, const std::string& hex, std::string* error) {
    Bytes bytes = fromHex(hex);
    Request r;
    size_t consumed = 0;
    return parseRequest(d, limits, bytes.data(), bytes.size(), &r, &consumed, error);
  };
  std::string error;
  CHECK(parse(Dialect::kLegacy, "09", &error) == ParseStatus::kError);
  CHECK_THAT(error, Catch::Contains("unknown query type 9"));
  CHECK(parse(Dialect::kV2, "13", &error) == ParseStatus::kError);
  // key of 17 bytes > 16: rejected as soon as the length is known, before the bytes arrive
  CHECK(parse(Dialect::kLegacy, "021100000000000000", &error) == ParseStatus::kError);
  CHECK_THAT(error, Catch::Contains("key of 17 bytes"));
  // value of 33 bytes
  CHECK(parse(Dialect::kLegacy, "0001000000000000006b2100000000000000", &error) ==
        ParseStatus::kError);
  CHECK_THAT(error, Catch::Contains("value of 33 bytes"));
  // 5 keys in a WAIT
  CHECK(parse(Dialect::kLegacy, "050500000000000000", &error) == ParseStatus::kError);
  CHECK_THAT(error, Catch::Contains("5 keys"));
  // the 2.2 handshake read as a legacy SET: an absurd key length (what torch 1.13 sees)
  CHECK(parse(Dialect::kLegacy, "00cef7853c0d92100000", &error) == ParseStatus::kError);
  // a huge forged key count within the limit but without the bytes: just incomplete
  limits.max_keys_per_request = 1u << 30;
  CHECK(parse(Dialect::kLegacy, "05ffffff3f00000000", &error) == ParseStatus::kNeedMore);
}

TEST_CASE("a large request arriving in small pieces decodes once complete", "[unit]") {
  Request big;
  big.type = QueryType::MULTI_SET;
  for (int i = 0; i < 5000; ++i) {
    big.keys.push_back("/key/" + std::to_string(i));
    big.values.push_back(b(std::string(static_cast<size_t>(i % 50), 'v')));
  }
  Bytes stream;
  Request validate;
  validate.type = QueryType::VALIDATE;
  validate.u32 = kValidationMagic;
  REQUIRE(encodeRequest(Dialect::kV2, validate, &stream));
  REQUIRE(encodeRequest(Dialect::kV2, big, &stream));
  RequestDecoder decoder{Limits{}};
  std::vector<Request> decoded;
  for (size_t off = 0; off < stream.size(); off += 7) {
    decoder.feed(stream.data() + off, std::min<size_t>(7, stream.size() - off));
    Request r;
    std::string error;
    ParseStatus st;
    while ((st = decoder.next(&r, &error)) == ParseStatus::kRequest) decoded.push_back(r);
    REQUIRE(st == ParseStatus::kNeedMore);
  }
  REQUIRE(decoded.size() == 2);
  CHECK(decoded[1] == big);
  CHECK(decoder.bufferedBytes() == 0);
}

TEST_CASE("counters are decimal text parsed as std::stoll does", "[unit]") {
  int64_t v = 0;
  CHECK((parseCounter(b("3"), &v) && v == 3));
  CHECK((parseCounter(b("-2"), &v) && v == -2));
  CHECK((parseCounter(b(" 12"), &v) && v == 12));
  CHECK((parseCounter(b("7abc"), &v) && v == 7));
  CHECK_FALSE(parseCounter(b("abc"), &v));
  CHECK_FALSE(parseCounter(b(""), &v));
  CHECK_FALSE(parseCounter(b("99999999999999999999"), &v));
  CHECK(formatCounter(-42) == b("-42"));
}

namespace {

// Decodes every request in `hex` with one decoder, fed all at once or one byte at a time (as a
// server sees requests that arrive in separate reads); the types in order, and the final
// dialect. Both ways must agree.
std::vector<QueryType> decodeTypes(const std::string& hex, Dialect no_handshake,
                                   std::optional<Dialect>* dialect) {
  std::vector<QueryType> result[2];
  std::optional<Dialect> final_dialect[2];
  for (int bytewise = 0; bytewise < 2; ++bytewise) {
    RequestDecoder decoder{Limits{}, no_handshake};
    Bytes bytes = fromHex(hex);
    Request r;
    std::string error;
    ParseStatus s = ParseStatus::kNeedMore;
    auto drain = [&] {
      while ((s = decoder.next(&r, &error)) == ParseStatus::kRequest) {
        result[bytewise].push_back(r.type);
      }
    };
    if (bytewise) {
      drain();  // an empty buffer first, as a server's first read may be
      for (uint8_t byte : bytes) {
        decoder.feed(&byte, 1);
        drain();
      }
    } else {
      decoder.feed(bytes.data(), bytes.size());
      drain();
    }
    INFO(error);
    CHECK(s == ParseStatus::kNeedMore);
    CHECK(decoder.bufferedBytes() == 0);
    final_dialect[bytewise] = decoder.dialect();
  }
  CHECK(result[0] == result[1]);
  CHECK(final_dialect[0] == final_dialect[1]);
  *dialect = final_dialect[1];
  return result[1];
}

// Wire forms used below (torch 2.1 bytes from tests/rendezvous/data/torch-2.1.json).
const std::string kAddInit = "030500000000000000696e69742f0100000000000000";  // ADD init/ 1
const std::string kType7Key1 = "0705000000000000002f6b657931";  // 2.1 DELETE_KEY /key1
const std::string kType8Log = "0804000000000000002f6c6f67";     // 1.13 DELETE_KEY /log
const std::string kAppendValue = "02000000000000006162";        // ... 2.1 APPEND's value "ab"
const std::string kCancelWait21 = "0b";

}  // namespace

TEST_CASE("torch 2.1 numbering is the captured one", "[unit]") {
  CHECK(queryTypeFromWire(Dialect::kV21, 0) == QueryType::SET);
  CHECK(queryTypeFromWire(Dialect::kV21, 6) == QueryType::GETNUMKEYS);
  CHECK(queryTypeFromWire(Dialect::kV21, 7) == QueryType::DELETE_KEY);
  CHECK(queryTypeFromWire(Dialect::kV21, 8) == QueryType::APPEND);
  CHECK(queryTypeFromWire(Dialect::kV21, 9) == QueryType::MULTI_GET);
  CHECK(queryTypeFromWire(Dialect::kV21, 10) == QueryType::MULTI_SET);
  CHECK(queryTypeFromWire(Dialect::kV21, 11) == QueryType::CANCEL_WAIT);
  CHECK_FALSE(queryTypeFromWire(Dialect::kV21, 12));
  CHECK_FALSE(queryTypeToWire(Dialect::kV21, QueryType::VALIDATE));
  CHECK_FALSE(queryTypeToWire(Dialect::kV21, QueryType::WATCH_KEY));
  CHECK_FALSE(queryTypeToWire(Dialect::kV21, QueryType::PING));
  // Every 2.1 request survives a round trip through a decoder told to expect 2.1.
  std::vector<Request> samples = samplesFor(Dialect::kV21);
  CHECK(samples.size() == 14);  // the 12 types, SET and WAIT twice
  Bytes all;
  for (const auto& r : samples) {
    Bytes one = encode(Dialect::kV21, r);
    all.insert(all.end(), one.begin(), one.end());
  }
  std::optional<Dialect> dialect;
  auto types = decodeTypes(toHex(all), Dialect::kV21, &dialect);
  REQUIRE(types.size() == samples.size());
  for (size_t i = 0; i < types.size(); ++i) CHECK(types[i] == samples[i].type);
  CHECK(dialect == Dialect::kV21);
}

TEST_CASE("a connection without handshake switches to torch 2.1 on what only 2.1 sends", "[unit]") {
  std::optional<Dialect> d;
  SECTION("type 7 after another request is 2.1's DELETE_KEY, and 8 is then APPEND") {
    auto types =
        decodeTypes(kAddInit + kType7Key1 + kType8Log + kAppendValue, Dialect::kLegacy, &d);
    CHECK(types ==
          std::vector<QueryType>{QueryType::ADD, QueryType::DELETE_KEY, QueryType::APPEND});
    CHECK(d == Dialect::kV21);
  }
  SECTION("CANCEL_WAIT (11), MULTI_SET (10), MULTI_GET (9) switch at once") {
    CHECK(decodeTypes(kCancelWait21, Dialect::kLegacy, &d) ==
          std::vector<QueryType>{QueryType::CANCEL_WAIT});
    CHECK(d == Dialect::kV21);
    CHECK(decodeTypes("0a0000000000000000", Dialect::kLegacy, &d) ==
          std::vector<QueryType>{QueryType::MULTI_SET});
    CHECK(d == Dialect::kV21);
    CHECK(decodeTypes("090100000000000000010000000000000061", Dialect::kLegacy, &d) ==
          std::vector<QueryType>{QueryType::MULTI_GET});
    CHECK(d == Dialect::kV21);
  }
  SECTION("a 1.13 callback connection's WATCH_KEYs stay WATCH_KEY") {
    CHECK(decodeTypes(kType7Key1 + kType7Key1, Dialect::kLegacy, &d) ==
          std::vector<QueryType>{QueryType::WATCH_KEY, QueryType::WATCH_KEY});
    CHECK(d == Dialect::kLegacy);
  }
  SECTION("a 1.13 main connection's DELETE_KEY (8) stays DELETE_KEY") {
    CHECK(decodeTypes(kAddInit + kType8Log + "06", Dialect::kLegacy, &d) ==
          std::vector<QueryType>{QueryType::ADD, QueryType::DELETE_KEY, QueryType::GETNUMKEYS});
    CHECK(d == Dialect::kLegacy);
  }
  SECTION("the limit of the rule: a 2.1 delete_key as the first request reads as WATCH_KEY") {
    CHECK(decodeTypes(kType7Key1, Dialect::kLegacy, &d) ==
          std::vector<QueryType>{QueryType::WATCH_KEY});
    CHECK(d == Dialect::kLegacy);
  }
  SECTION("told that clients are 2.1, 7 and 8 are 2.1's from the first byte") {
    CHECK(decodeTypes(kType7Key1 + kType8Log + kAppendValue, Dialect::kV21, &d) ==
          std::vector<QueryType>{QueryType::DELETE_KEY, QueryType::APPEND});
    CHECK(d == Dialect::kV21);
  }
  SECTION("a torch >= 2.2 handshake still wins") {
    CHECK(decodeTypes("00cef7853c"
                      "0d2d090100",
                      Dialect::kV21,
                      &d) == std::vector<QueryType>{QueryType::VALIDATE, QueryType::PING});
    CHECK(d == Dialect::kV2);
  }
}
