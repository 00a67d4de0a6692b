// The automatic progress module (agent/supervision/python_progress.h) with a real interpreter: it
// hands over to the next sitecustomize on the path, keeps its switch from the worker's children,
// and stays silent in a program that never initialises torch.distributed. The stamps themselves, in
// a real gloo job, are tested end to end in tests/e2e/operations_test.cc.
#include "agent/supervision/python_progress.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "tests/support/test_support.h"

namespace {

using namespace cpprun;
using namespace cpprun::agent;
using namespace std::chrono_literals;

}  // namespace

TEST_CASE("python progress: PYTHONPATH gets the module's directory first, then what was there",
          "[unit]") {
  std::map<std::string, std::string> env;
  addPythonProgress(env, "/run/a/python", 300ms, "/site/lib:/more");
  CHECK(env.at("PYTHONPATH") == "/run/a/python:/site/lib:/more");
  CHECK(env.at(kPythonProgressVariable) == "300");
  // A PYTHONPATH the worker's spec sets wins over the agent's own.
  std::map<std::string, std::string> spec_env{{"PYTHONPATH", "/job"}};
  addPythonProgress(spec_env, "/d", 50ms, "/agent");
  CHECK(spec_env.at("PYTHONPATH") == "/d:/job");
  std::map<std::string, std::string> none;
  addPythonProgress(none, "/d", 50ms, nullptr);
  CHECK(none.at("PYTHONPATH") == "/d");  // no trailing ':' (that would add the cwd)
  // --warm-restart without stall detection: the module for its import record, no stamps.
  std::map<std::string, std::string> record_only;
  addPythonProgress(record_only, "/d", 0ms, nullptr);
  CHECK(record_only.at("PYTHONPATH") == "/d");
  CHECK(record_only.count(kPythonProgressVariable) == 0);
  CHECK(pythonProgressInterval(3s) == 300ms);
  CHECK(pythonProgressInterval(100ms) == 50ms);
  CHECK(pythonProgressInterval(600s) == 500ms);
}

TEST_CASE(
    "python progress: the module chains to the next sitecustomize, hides its switch from "
    "children and stamps nothing before torch.distributed is up",
    "[integration]") {
  testing::TempDir dir;
  const std::string ours = dir.path() + "/cpprun";
  REQUIRE(writePythonProgressModule(ours).isOk());
  const std::string theirs = dir.path() + "/site";
  std::filesystem::create_directories(theirs);
  std::ofstream(theirs + "/sitecustomize.py") << "print('SITE-CUSTOMIZE-CHAINED', flush=True)\n";
  const std::string progress = dir.path() + "/progress";
  std::map<std::string, std::string> env{{"CPPRUN_PROGRESS_FILE", progress}};
  addPythonProgress(env, ours, 50ms, theirs.c_str());
  testing::ChildProcess python(
      {CPPRUN_PYTHON, "-c",
       "import os, sys, threading, time\n"
       "print('SWITCH', os.environ.get('CPPRUN_PYTHON_PROGRESS'))\n"
       "print('THREAD', any(t.name == 'cpprun-progress' for t in threading.enumerate()))\n"
       "end = time.time() + 0.5\n"
       "while time.time() < end: pass\n"
       "print('DONE', flush=True)\n"},
      env);
  auto status = python.wait(60s);
  REQUIRE(status.has_value());
  INFO(python.output());
  CHECK(testing::exitCodeOf(*status) == 0);
  CHECK_THAT(python.output(), Catch::Contains("SITE-CUSTOMIZE-CHAINED"));
  CHECK_THAT(python.output(), Catch::Contains("SWITCH None"));  // popped: children do not stamp
  CHECK_THAT(python.output(), Catch::Contains("THREAD True"));
  CHECK_THAT(python.output(), Catch::Contains("DONE"));
  CHECK_FALSE(std::filesystem::exists(progress));  // no torch.distributed: nothing stamped
  // The program ended: the exit marker is there, so its finalization is not timed as a stall.
  CHECK(std::filesystem::exists(progress + ".exiting"));
}
