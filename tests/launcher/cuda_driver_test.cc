// The CUDA driver reader against the stand-in driver (tests/support/stand_in_cuda.cc), loaded
// by its path in this process: what it reports, and each way a driver can be missing or fail.
// Every expected value is one only the stand-in reports, so a test cannot pass on another
// library.
#include "launcher/cuda_driver.h"

#include <stdlib.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <string>

using cpprun::StatusCode;
using cpprun::launcher::cudaVersionText;
using cpprun::launcher::queryCudaDriver;

namespace {

const std::string kStandInDriver = std::string(CPPRUN_STAND_IN_DIR) + "/driver/libcuda.so.1";

// Sets the stand-in's variables for one test and removes them after it.
class StandInEnv {
 public:
  StandInEnv(const char* devices, const char* init_error = nullptr, const char* version = nullptr) {
    set("CPPRUN_STAND_IN_CUDA_DEVICES", devices);
    set("CPPRUN_STAND_IN_CUDA_INIT_ERROR", init_error);
    set("CPPRUN_STAND_IN_CUDA_DRIVER_VERSION", version);
  }
  ~StandInEnv() {
    ::unsetenv("CPPRUN_STAND_IN_CUDA_DEVICES");
    ::unsetenv("CPPRUN_STAND_IN_CUDA_INIT_ERROR");
    ::unsetenv("CPPRUN_STAND_IN_CUDA_DRIVER_VERSION");
  }
  StandInEnv(const StandInEnv&) = delete;
  StandInEnv& operator=(const StandInEnv&) = delete;

 private:
  static void set(const char* name, const char* value) {
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
};

}  // namespace

TEST_CASE("the driver's version and every device's name and PCI bus id are read", "[unit]") {
  StandInEnv env("8", nullptr, "13020");
  auto driver = queryCudaDriver(kStandInDriver);
  REQUIRE(driver.isOk());
  CHECK(driver.value().version == 13020);
  CHECK(cudaVersionText(driver.value().version) == "13.2");
  REQUIRE(driver.value().devices.size() == 8);
  for (int i = 0; i < 8; ++i) {
    CHECK(driver.value().devices[i].name == "Stand-in GPU " + std::to_string(i));
    char bus[16];
    std::snprintf(bus, sizeof bus, "0000:%02X:00.0", 0xA0 + i);
    CHECK(driver.value().devices[i].pci_bus_id == bus);
  }
}

TEST_CASE("a driver without devices answers zero devices, not an error", "[unit]") {
  StandInEnv env("0");  // cuInit answers CUDA_ERROR_NO_DEVICE, as the real driver does
  auto driver = queryCudaDriver(kStandInDriver);
  REQUIRE(driver.isOk());
  CHECK(driver.value().devices.empty());
  CHECK(driver.value().version == 12090);
}

TEST_CASE("a driver whose cuInit fails is unavailable, naming the call and the error", "[unit]") {
  {
    StandInEnv env("8", "803");
    auto driver = queryCudaDriver(kStandInDriver);
    REQUIRE_FALSE(driver.isOk());
    CHECK(driver.status().code() == StatusCode::kUnavailable);
    CHECK(driver.status().message() ==
          kStandInDriver +
              ": cuInit failed with CUDA_ERROR_SYSTEM_DRIVER_MISMATCH (803: system has "
              "unsupported display driver / cuda driver combination)");
  }
  {  // A code the driver has no name for is still given as a number.
    StandInEnv env("8", "4242");
    auto driver = queryCudaDriver(kStandInDriver);
    REQUIRE_FALSE(driver.isOk());
    CHECK(driver.status().code() == StatusCode::kUnavailable);
    CHECK_THAT(driver.status().message(), Catch::EndsWith("cuInit failed with CUDA error (4242)"));
  }
}

TEST_CASE("no driver, or a library that is not one, is not found", "[unit]") {
  auto missing = queryCudaDriver("/nonexistent/libcuda.so.1");
  REQUIRE_FALSE(missing.isOk());
  CHECK(missing.status().code() == StatusCode::kNotFound);
  CHECK_THAT(missing.status().message(),
             Catch::StartsWith("/nonexistent/libcuda.so.1 does not load: "));
  auto not_cuda = queryCudaDriver("libm.so.6");
  REQUIRE_FALSE(not_cuda.isOk());
  CHECK(not_cuda.status().code() == StatusCode::kNotFound);
  CHECK_THAT(not_cuda.status().message(), Catch::Contains("lacks the driver API"));
}
