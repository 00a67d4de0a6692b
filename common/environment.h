// Reading a captured environment (the name -> value map cpprun takes once at start-up and
// passes down, so that tests can hand any environment in).
// Thread safety: pure functions of their arguments.
#pragma once

#include <map>
#include <string>

namespace cpprun {

using EnvironmentMap = std::map<std::string, std::string>;

// The value of `name` in `env`, or `fallback` when it is not set (an empty value is a value).
inline std::string envOr(const EnvironmentMap& env, const std::string& name,
                         const std::string& fallback = "") {
  auto it = env.find(name);
  return it == env.end() ? fallback : it->second;
}

}  // namespace cpprun
