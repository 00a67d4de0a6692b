// --warm-restart's pure parts (agent/processes/warm_start_launcher.h): which workers the warm
// process may start, which variables it fixes for them, its memory bound, and the module record
// read from the job's store (untrusted). The warm process itself, with real agents and torch, is
// tested end to end in tests/e2e/warm_restart_test.cc.
#include "agent/processes/warm_start_launcher.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

namespace {

using namespace cpprun::agent;

}  // namespace

TEST_CASE("warm start: only python -u PROGRAM and python -u -m MODULE workers are eligible",
          "[unit]") {
  CHECK(warmIneligibility({"/usr/bin/python3", "-u", "train.py", "--lr", "1"}).empty());
  CHECK(warmIneligibility({"/venv/bin/python", "-u", "-m", "pkg.train"}).empty());
  CHECK_FALSE(warmIneligibility({"/usr/bin/python3", "train.py"}).empty());  // no -u
  CHECK_FALSE(warmIneligibility({"/usr/bin/python3", "-u", "-m"}).empty());  // no module
  CHECK_FALSE(warmIneligibility({"/usr/bin/python3", "-u", "-c", "print(1)"}).empty());
  CHECK_FALSE(warmIneligibility({"/bin/sh", "-c", "exit 0"}).empty());  // --no-python
  CHECK_FALSE(warmIneligibility({"./trainer"}).empty());
  CHECK(warmIneligibility({"./trainer"}).find("not Python programs") != std::string::npos);
}

TEST_CASE("warm start: the variables read at interpreter start or library load must be equal",
          "[unit]") {
  for (const char* name : {"PYTHONPATH", "PYTHONHASHSEED", "PYTHONUNBUFFERED", "LANG", "LC_ALL",
                           "LC_CTYPE", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                           "LD_PRELOAD", "LD_LIBRARY_PATH"}) {
    INFO(name);
    CHECK(interpreterWideVariable(name));
  }
  // A worker's identity and everything read after the fork are its own.
  for (const char* name :
       {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT", "CUDA_VISIBLE_DEVICES",
        "TORCHELASTIC_RESTART_COUNT", "NCCL_DEBUG", "PATH", "HOME"}) {
    INFO(name);
    CHECK_FALSE(interpreterWideVariable(name));
  }
}

TEST_CASE("warm start: a warm process that grew past its bound since it was ready is not used",
          "[unit]") {
  WarmStartOptions options;  // x2 + 512 MiB
  CHECK(warmProcessGrowth(500 * 1024, 500 * 1024, options).empty());
  CHECK(warmProcessGrowth(500 * 1024, 1512 * 1024, options).empty());  // exactly the bound
  const std::string grown = warmProcessGrowth(500 * 1024, 1513 * 1024, options);
  CHECK(grown ==
        "the warm process grew from 500 MiB to 1513 MiB since it was ready (bound "
        "1512 MiB)");
  options.memory_growth_factor = 1.0;
  options.memory_slack_kib = 0;
  CHECK_FALSE(warmProcessGrowth(100, 101, options).empty());
}

TEST_CASE("warm start: the module record round-trips, stdlib names with '-' included", "[unit]") {
  const std::vector<std::string> modules = {"os",
                                            "torch",
                                            "torch.nn.parallel",
                                            "_io",
                                            "_sysconfigdata__x86_64-linux-gnu",
                                            "numpy.core._x2"};
  auto parsed = parseWarmImportsRecord(warmImportsRecord(modules));
  REQUIRE(parsed.isOk());
  CHECK(parsed.value() == modules);
  CHECK(parseWarmImportsRecord("[]").isOk());
}

TEST_CASE("warm start: a module record that is not a list of module names is an error saying why",
          "[unit]") {
  struct Case {
    std::string text;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"", "not a JSON array"},
      {"{\"a\":1}", "not a JSON array"},
      {"[1]", "non-string"},
      {"[\"os\", null]", "non-string"},
      {"[\"\"]", "not a Python module name"},
      {"[\"a..b\"]", "not a Python module name"},
      {"[\".a\"]", "not a Python module name"},
      {"[\"a.\"]", "not a Python module name"},
      {"[\"1abc\"]", "not a Python module name"},
      {"[\"-x\"]", "not a Python module name"},
      {"[\"os; rm -rf /\"]", "not a Python module name"},
      {"[\"os/path\"]", "not a Python module name"},
      {"[\"" + std::string(201, 'a') + "\"]", "not a Python module name"},
  };
  for (const Case& c : cases) {
    INFO(c.text.substr(0, 80));
    auto parsed = parseWarmImportsRecord(c.text);
    REQUIRE_FALSE(parsed.isOk());
    CHECK(parsed.status().message().find(c.says) != std::string::npos);
  }
  std::string many = "[";
  for (size_t i = 0; i <= kMaxWarmModules; ++i) many += std::string(i ? "," : "") + "\"m\"";
  many += "]";
  auto too_many = parseWarmImportsRecord(many);
  REQUIRE_FALSE(too_many.isOk());
  CHECK(too_many.status().message().find("over 20000 modules") != std::string::npos);
  auto too_big = parseWarmImportsRecord(std::string((size_t{4} << 20) + 1, ' '));
  REQUIRE_FALSE(too_big.isOk());
  CHECK(too_big.status().message().find("over 4 MiB") != std::string::npos);
}
