// RecordReader: the typed reader of one record read from a store, a file or a peer. It parses
// the bytes (bounded in size), then hands out fields by type and range; the first field that
// is present with the wrong type or out of its range turns the whole record into an error
// naming the record and the field ("attempt/0/stop: \"by\" is a string, not an integer in
// -1..65535"). An absent optional field keeps its default. No exception escapes, whatever the
// bytes: the job's records (job_keys.h) and the rank digests are decoded through it, and the
// record fuzzer (tests/fuzz/record_fuzz.cc) holds every decoder to it.
//
// Use: construct over the bytes (or a parsed sub-document), read every field, then check
// status() once; the values read after an error are the defaults and must be thrown away.
//
// Thread safety: a value type; one reader per thread.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace cpprun::agent {

// The largest record an agent reads from a store (the largest a store value may be: the TCP
// store's and torch's libuv store's cap). A node's report with 4,096 ranks' states and
// failures with their tails stays far below it.
inline constexpr size_t kMaxRecordBytes = 8u << 20;

// The bytes as JSON when they are at most `max_bytes`, nested at most 64 levels and JSON;
// otherwise a JSON null and `why` (when given) says what was wrong. Never throws.
nlohmann::json parseBoundedJson(std::string_view bytes, size_t max_bytes = kMaxRecordBytes,
                                std::string* why = nullptr);

class RecordReader {
 public:
  // Parses `bytes` as a JSON object named `where` (the record's key). Bytes over `max_bytes`,
  // that are not JSON, or not an object: status() says so.
  RecordReader(std::string_view bytes, std::string where, size_t max_bytes = kMaxRecordBytes);
  // A sub-document (an element of a record's array) named `where`; not an object: an error.
  RecordReader(const nlohmann::json& doc, std::string where);
  RecordReader(const RecordReader&) = delete;
  RecordReader& operator=(const RecordReader&) = delete;

  const Status& status() const { return status_; }
  bool ok() const { return status_.isOk(); }
  const nlohmann::json& doc() const { return doc_; }
  bool has(const char* field) const;

  // An integer field in [lo, hi]; absent: `fallback`. `required`: absent is an error too.
  int64_t integer(const char* field, int64_t fallback, int64_t lo, int64_t hi,
                  bool required = false);
  int intIn(const char* field, int fallback, int lo, int hi, bool required = false) {
    return static_cast<int>(integer(field, fallback, lo, hi, required));
  }
  bool boolean(const char* field, bool fallback);
  // A string field of at most `max_bytes`; absent: `fallback`.
  std::string text(const char* field, const std::string& fallback, size_t max_bytes,
                   bool required = false);
  // A list of strings, at most `max_items` of at most `max_bytes` each; absent: empty.
  std::vector<std::string> texts(const char* field, size_t max_items, size_t max_bytes);
  // An array field of at most `max_items` elements (each checked by the caller with a
  // sub-reader); absent: empty. The pointer stays valid while this reader lives.
  std::vector<const nlohmann::json*> array(const char* field, size_t max_items);
  // An object field (absent or null: nullptr).
  const nlohmann::json* object(const char* field);
  // Records an error about this record (a value the reader cannot check by type alone).
  void fail(const std::string& what);

 private:
  const nlohmann::json* find(const char* field, bool required);
  void wrongType(const char* field, const char* wanted);

  nlohmann::json owned_;
  const nlohmann::json& doc_;
  std::string where_;
  Status status_;
};

}  // namespace cpprun::agent
