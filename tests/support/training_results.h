// Reading what a training run left behind: the per-epoch "test" records of a JSON-lines
// metrics file (cpprun-mnist's and examples/python/mnist_ddp.py's format), and how far apart
// two parameter vectors are.
// Thread safety: pure functions.
#pragma once

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

namespace cpprun::testing {

inline std::vector<nlohmann::json> testRecords(const std::string& metrics_path) {
  std::vector<nlohmann::json> records;
  std::ifstream in(metrics_path);
  std::string line;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j.at("event") == "test") records.push_back(j);
  }
  return records;
}

// ||a - b|| / ||b||. Vectors of different sizes are a test bug.
inline double relativeDistance(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) throw std::invalid_argument("relativeDistance: sizes differ");
  double diff = 0.0;
  double norm = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(diff) / std::max(1e-30, std::sqrt(norm));
}

}  // namespace cpprun::testing
