// jsonField: one field of a JSON record read from a store, a file or a peer, without exceptions.
// nlohmann's value() and get() throw on a wrong type; a record anyone can write must not. The
// record readers of the agent (job_keys.h, stall_verdict.h) read their fields through this.
//
// Thread safety: a pure function.
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace cpprun::agent {

// The field `key` of `doc` as T (bool, an integer type, std::string, or std::vector<std::string>
// keeping only the array's strings); nullopt when `doc` is not an object, the key is missing, or
// the value is of another type or out of T's range.
template <typename T>
std::optional<T> jsonField(const nlohmann::json& doc, const char* key) {
  if (!doc.is_object()) return std::nullopt;
  const auto it = doc.find(key);
  if (it == doc.end()) return std::nullopt;
  if constexpr (std::is_same_v<T, bool>) {
    if (!it->is_boolean()) return std::nullopt;
    return it->template get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    if (!it->is_number_integer()) return std::nullopt;
    if (it->is_number_unsigned()) {
      const uint64_t v = it->template get<uint64_t>();
      if (v > static_cast<uint64_t>(std::numeric_limits<T>::max())) return std::nullopt;
      return static_cast<T>(v);
    }
    const int64_t v = it->template get<int64_t>();
    if (v < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
        v > static_cast<int64_t>(std::numeric_limits<T>::max())) {
      return std::nullopt;
    }
    return static_cast<T>(v);
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!it->is_string()) return std::nullopt;
    return it->template get<std::string>();
  } else {
    static_assert(std::is_same_v<T, std::vector<std::string>>);
    if (!it->is_array()) return std::nullopt;
    T out;
    for (const nlohmann::json& item : *it) {
      if (item.is_string()) out.push_back(item.template get<std::string>());
    }
    return out;
  }
}

}  // namespace cpprun::agent
