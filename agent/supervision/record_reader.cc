#include "agent/supervision/record_reader.h"

#include <utility>

namespace cpprun::agent {

using nlohmann::json;

namespace {

const char* typeName(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::object:
      return "an object";
    case json::value_t::array:
      return "a list";
    case json::value_t::string:
      return "text";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return "an integer";
    case json::value_t::number_float:
      return "a fraction";
    default:
      return "binary";
  }
}

Status malformed(const std::string& where, const std::string& what) {
  return internalError(where + ": " + what);
}

}  // namespace

json parseBoundedJson(std::string_view bytes, size_t max_bytes, std::string* why) {
  auto refuse = [&](std::string what) {
    if (why != nullptr) *why = std::move(what);
    return json();
  };
  if (bytes.size() > max_bytes) {
    return refuse("the record is " + std::to_string(bytes.size()) + " bytes, over the bound of " +
                  std::to_string(max_bytes));
  }
  // nlohmann parses recursively: a deeply nested document is refused before it is parsed (a
  // record of the job is at most four levels deep).
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < bytes.size(); ++i) {
    const char c = bytes[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if ((c == '{' || c == '[') && ++depth > 64) {
      return refuse("the record is nested more than 64 levels deep");
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  json doc = json::parse(bytes.begin(), bytes.end(), nullptr, false);
  if (doc.is_discarded())
    return refuse(bytes.empty() ? "the record is empty" : "the record is not JSON");
  return doc;
}

RecordReader::RecordReader(std::string_view bytes, std::string where, size_t max_bytes)
    : doc_(owned_), where_(std::move(where)) {
  std::string why;
  owned_ = parseBoundedJson(bytes, max_bytes, &why);
  if (!why.empty()) {
    status_ = malformed(where_, why);
  } else if (!owned_.is_object()) {
    status_ =
        malformed(where_, std::string("the record is ") + typeName(owned_) + ", not a JSON object");
  }
}

RecordReader::RecordReader(const json& doc, std::string where)
    : doc_(doc), where_(std::move(where)) {
  if (!doc_.is_object()) {
    status_ =
        malformed(where_, std::string("the record is ") + typeName(doc_) + ", not a JSON object");
  }
}

bool RecordReader::has(const char* field) const { return doc_.is_object() && doc_.contains(field); }

void RecordReader::fail(const std::string& what) {
  if (status_.isOk()) status_ = malformed(where_, what);
}

void RecordReader::wrongType(const char* field, const char* wanted) {
  const json* v = doc_.is_object() && doc_.contains(field) ? &doc_.at(field) : nullptr;
  fail(std::string("\"") + field + "\" is " + (v ? typeName(*v) : "missing") + ", not " + wanted);
}

const json* RecordReader::find(const char* field, bool required) {
  if (!status_.isOk() || !doc_.is_object()) return nullptr;
  const auto it = doc_.find(field);
  if (it == doc_.end()) {
    if (required) fail(std::string("\"") + field + "\" is missing");
    return nullptr;
  }
  return &*it;
}

int64_t RecordReader::integer(const char* field, int64_t fallback, int64_t lo, int64_t hi,
                              bool required) {
  const json* v = find(field, required);
  if (v == nullptr) return fallback;
  const std::string wanted = "an integer in " + std::to_string(lo) + ".." + std::to_string(hi);
  if (!v->is_number_integer()) {
    wrongType(field, wanted.c_str());
    return fallback;
  }
  const bool big = v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX);
  const int64_t n = big ? INT64_MAX : v->get<int64_t>();
  if (big || n < lo || n > hi) {
    fail(std::string("\"") + field + "\" is " + v->dump() + ", not " + wanted);
    return fallback;
  }
  return n;
}

bool RecordReader::boolean(const char* field, bool fallback) {
  const json* v = find(field, false);
  if (v == nullptr) return fallback;
  if (!v->is_boolean()) {
    wrongType(field, "a boolean");
    return fallback;
  }
  return v->get<bool>();
}

std::string RecordReader::text(const char* field, const std::string& fallback, size_t max_bytes,
                               bool required) {
  const json* v = find(field, required);
  if (v == nullptr) return fallback;
  if (!v->is_string()) {
    wrongType(field, "text");
    return fallback;
  }
  const std::string& s = v->get_ref<const std::string&>();
  if (s.size() > max_bytes) {
    fail(std::string("\"") + field + "\" is " + std::to_string(s.size()) +
         " bytes long, over the bound of " + std::to_string(max_bytes));
    return fallback;
  }
  return s;
}

std::vector<std::string> RecordReader::texts(const char* field, size_t max_items,
                                             size_t max_bytes) {
  std::vector<std::string> out;
  for (const json* item : array(field, max_items)) {
    if (!item->is_string() || item->get_ref<const std::string&>().size() > max_bytes) {
      fail(std::string("\"") + field + "\" holds an item that is not text of at most " +
           std::to_string(max_bytes) + " bytes");
      return {};
    }
    out.push_back(item->get<std::string>());
  }
  return out;
}

std::vector<const json*> RecordReader::array(const char* field, size_t max_items) {
  const json* v = find(field, false);
  if (v == nullptr) return {};
  if (!v->is_array()) {
    wrongType(field, "a list");
    return {};
  }
  if (v->size() > max_items) {
    fail(std::string("\"") + field + "\" has " + std::to_string(v->size()) +
         " items, over the bound of " + std::to_string(max_items));
    return {};
  }
  std::vector<const json*> out;
  out.reserve(v->size());
  for (const json& item : *v) out.push_back(&item);
  return out;
}

const json* RecordReader::object(const char* field) {
  const json* v = find(field, false);
  if (v == nullptr || v->is_null()) return nullptr;
  if (!v->is_object()) {
    wrongType(field, "an object");
    return nullptr;
  }
  return v;
}

}  // namespace cpprun::agent
