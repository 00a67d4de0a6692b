// libFuzzer target: arbitrary bytes through the incremental decoder (cut into chunks chosen by
// the input itself) and every decoded request through the store engine.
//
// Checks: no crash, no sanitizer report; input cut into pieces decodes exactly as the whole
// does; round trips, for every row of the operation table in every dialect it exists in:
// parse(encode(request)) == request and encode(parse(bytes)) == bytes (the input read as a
// request of each row, and the decoded stream as a whole); the input read as a reply of every
// shape (the client's decoder) never reads past its end and asks for more only past it.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <vector>

#include "rendezvous/store_engine.h"
#include "rendezvous/wire.h"

namespace {

using namespace cpprun::rendezvous;
using namespace cpprun::rendezvous::wire;

class DiscardingOutbox : public Outbox {
 public:
  void send(ClientId, const uint8_t*, size_t size) override { sent += size; }
  size_t sent = 0;
};

void checkRoundTrip(Dialect d, const Request& r, const Limits& limits) {
  Bytes encoded;
  if (!encodeRequest(d, r, &encoded)) std::abort();  // decoded in d, so d has this type
  Request again;
  size_t consumed = 0;
  std::string error;
  if (parseRequest(d, limits, encoded.data(), encoded.size(), &again, &consumed, &error) !=
          ParseStatus::kRequest ||
      consumed != encoded.size() || !(again == r)) {
    std::abort();
  }
}

struct Decoded {
  std::vector<Request> requests;
  std::vector<Dialect> dialects;  // each request's (a legacy connection may switch to 2.1)
  std::optional<Dialect> dialect;
  bool failed = false;  // stopped at a malformed request
  size_t consumed = 0;  // bytes of the whole requests
};

// The input, after a type byte of each row in turn, read as a request of that row in every
// dialect that has it: a decoded request re-encodes to exactly the bytes it came from.
void checkEveryRow(const uint8_t* data, size_t size, const Limits& limits) {
  Bytes framed(size + 1);
  if (size > 0) std::memcpy(framed.data() + 1, data, size);
  Request r;
  for (const Operation& op : kOperations) {
    for (Dialect d : {Dialect::kLegacy, Dialect::kV21, Dialect::kV2}) {
      if (op.wireByte(d) == kNone) continue;
      framed[0] = static_cast<uint8_t>(op.wireByte(d));
      size_t consumed = 0;
      std::string error;
      ParseStatus s = parseRequest(d, limits, framed.data(), framed.size(), &r, &consumed, &error);
      if (s == ParseStatus::kError && error.empty()) std::abort();
      if (s != ParseStatus::kRequest) continue;
      if (r.type != op.type) std::abort();
      Bytes encoded;
      if (!encodeRequest(d, r, &encoded)) std::abort();
      if (encoded.size() != consumed || std::memcmp(encoded.data(), framed.data(), consumed) != 0) {
        std::abort();
      }
      checkRoundTrip(d, r, limits);
    }
  }
}

// Decodes `data` fed in pieces of `chunk` bytes; stops at the first error.
Decoded decodeInChunks(const uint8_t* data, size_t size, size_t chunk, const Limits& limits) {
  RequestDecoder decoder(limits);
  Decoded out;
  size_t fed = 0;
  for (size_t off = 0; off < size && !out.failed; off += chunk) {
    const size_t piece = std::min(chunk, size - off);
    decoder.feed(data + off, piece);
    fed += piece;
    while (true) {
      Request r;
      std::string error;
      ParseStatus s = decoder.next(&r, &error);
      if (s == ParseStatus::kNeedMore) break;
      if (s == ParseStatus::kError) {
        if (error.empty()) std::abort();  // every rejection says why
        out.failed = true;
        break;
      }
      out.requests.push_back(r);
      out.dialects.push_back(*decoder.dialect());
    }
  }
  out.dialect = decoder.dialect();
  out.consumed = fed - decoder.bufferedBytes();
  return out;
}

// The client's reply decoder on arbitrary server bytes: a whole reply lies within the input, a
// missing one is asked for past its end, an error says why; and the server's encoder
// (encodeReply) writes a decoded reply back to the very bytes it was read from.
void checkReplies(const uint8_t* data, size_t size) {
  static Reply reply;
  for (const Operation& op : kOperations) {
    for (size_t keys : {0, 1, 3}) {
      size_t consumed = 0;
      std::string error;
      switch (parseReply(op.reply, keys, data, size, 4096, &reply, &consumed, &error)) {
        case ParseStatus::kRequest: {
          if (consumed > size) std::abort();
          // The server's encoder writes back exactly the bytes the client's decoder read.
          std::vector<ByteView> items(reply.values.begin(), reply.values.end());
          ReplyFields fields;
          fields.byte = reply.byte;
          fields.u32 = reply.u32;
          fields.integer = reply.integer;
          if (!reply.values.empty()) fields.value = reply.values[0];
          fields.items = items.data();
          fields.item_count = items.size();
          Bytes encoded;
          encodeReply(op.reply, fields, &encoded);
          if (encoded.size() != consumed || replySize(op.reply, fields) != consumed ||
              !std::equal(encoded.begin(), encoded.end(), data)) {
            std::abort();
          }
          break;
        }
        case ParseStatus::kNeedMore:
          if (consumed <= size) std::abort();
          break;
        case ParseStatus::kError:
          if (error.empty()) std::abort();
          break;
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  Limits limits;
  limits.max_key_bytes = 256;
  limits.max_value_bytes = 4096;
  limits.max_keys_per_request = 64;
  // The first byte picks the chunk size, so split requests are explored too.
  size_t chunk = 1 + data[0] % 17;
  data += 1;
  size -= 1;

  // However the bytes are cut, the decoder sees the same requests and the same error.
  Decoded split = decodeInChunks(data, size, chunk, limits);
  Decoded whole = decodeInChunks(data, size, size + 1, limits);
  if (!(split.requests == whole.requests) || split.dialects != whole.dialects ||
      split.failed != whole.failed) {
    std::abort();
  }

  // encode(parse(bytes)) == bytes for the stream: the decoded requests, re-encoded in the
  // dialect each was read in, are exactly the bytes the decoder consumed.
  if (split.consumed != whole.consumed) std::abort();
  Bytes reencoded;
  for (size_t i = 0; i < whole.requests.size(); ++i) {
    if (!encodeRequest(whole.dialects[i], whole.requests[i], &reencoded)) std::abort();
  }
  if (reencoded.size() != whole.consumed ||
      (whole.consumed > 0 && std::memcmp(reencoded.data(), data, whole.consumed) != 0)) {
    std::abort();
  }
  checkEveryRow(data, size, limits);
  checkReplies(data, size);

  static DiscardingOutbox outbox;
  StoreEngine engine(&outbox);
  ClientId client = 1;
  for (size_t i = 0; i < split.requests.size(); ++i) {
    const Request& r = split.requests[i];
    checkRoundTrip(split.dialects[i], r, limits);
    // Alternate between two clients so wakes and watches cross connections.
    client = client == 1 ? 2 : 1;
    std::string error;
    if (!engine.handle(client, split.dialects[i], r, &error)) engine.disconnect(client);
  }
  engine.disconnect(1);
  engine.disconnect(2);
  return 0;
}
