// The default interpreter rule (launcher/python_interpreter.h): PYTHON_EXEC, else the Python
// environment cpprun's executable lies in, else python3 from PATH.
#include "launcher/python_interpreter.h"

#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "tests/support/test_support.h"

namespace {

namespace fs = std::filesystem;
using cpprun::launcher::environmentPython;
using cpprun::launcher::pythonInterpreter;

void touch(const fs::path& p, bool executable) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << "#!/bin/sh\n";
  ::chmod(p.c_str(), executable ? 0755 : 0644);
}

}  // namespace

TEST_CASE("a cpprun in a venv's bin/ runs workers with that venv's python", "[unit]") {
  cpprun::testing::TempDir tmp;
  const fs::path env = fs::path(tmp.path()) / "venv";
  touch(env / "bin" / "cpprun", true);
  const std::string exe = (env / "bin" / "cpprun").string();

  // A bin/ with a python but no pyvenv.cfg (e.g. /usr/bin): not an environment.
  touch(env / "bin" / "python3", true);
  CHECK(environmentPython(exe).empty());
  CHECK(pythonInterpreter({}, exe) == "python3");

  std::ofstream(env / "pyvenv.cfg") << "home = /usr/bin\n";
  CHECK(environmentPython(exe) == (env / "bin" / "python3").string());
  CHECK(pythonInterpreter({}, exe) == (env / "bin" / "python3").string());
  // PYTHON_EXEC still wins.
  CHECK(pythonInterpreter({{"PYTHON_EXEC", "/usr/bin/python3"}}, exe) == "/usr/bin/python3");

  // Only `python` (python3 missing or not executable): that one.
  ::chmod((env / "bin" / "python3").c_str(), 0644);
  touch(env / "bin" / "python", true);
  CHECK(environmentPython(exe) == (env / "bin" / "python").string());

  // A venv without any executable python: python3 from PATH.
  fs::remove(env / "bin" / "python");
  CHECK(pythonInterpreter({}, exe) == "python3");
}

TEST_CASE("a cpprun inside a venv's site-packages runs workers with that venv's python", "[unit]") {
  // Where auditwheel's repair puts the binary: <venv>/lib/python3.11/site-packages/cpprun.scripts/.
  cpprun::testing::TempDir tmp;
  const fs::path env = fs::path(tmp.path()) / "venv";
  const fs::path exe = env / "lib" / "python3.11" / "site-packages" / "cpprun.scripts" / "cpprun";
  touch(exe, true);
  touch(env / "bin" / "python3", true);
  CHECK(environmentPython(exe.string()).empty());  // no pyvenv.cfg yet
  std::ofstream(env / "pyvenv.cfg") << "home = /usr/bin\n";
  CHECK(environmentPython(exe.string()) == (env / "bin" / "python3").string());
  // Not under site-packages: a build folder somewhere inside the venv is not the venv's.
  touch(env / "src" / "cpprun" / "build" / "cpprun", true);
  CHECK(environmentPython((env / "src" / "cpprun" / "build" / "cpprun").string()).empty());
}

TEST_CASE("a cpprun in a conda environment's bin/ runs workers with its python", "[unit]") {
  cpprun::testing::TempDir tmp;
  const fs::path env = fs::path(tmp.path()) / "conda-env";
  touch(env / "bin" / "cpprun", true);
  touch(env / "bin" / "python", true);
  const std::string exe = (env / "bin" / "cpprun").string();
  CHECK(pythonInterpreter({}, exe) == "python3");  // no conda-meta/: not an environment
  fs::create_directories(env / "conda-meta");
  CHECK(pythonInterpreter({}, exe) == (env / "bin" / "python").string());
}

TEST_CASE("a cpprun outside any Python environment runs workers with python3 from PATH", "[unit]") {
  CHECK(pythonInterpreter({}, "/usr/bin/cpprun") == "python3");  // /usr/pyvenv.cfg: none
  CHECK(pythonInterpreter({}, "") == "python3");
  CHECK(pythonInterpreter({{"PYTHON_EXEC", "python3.11"}}, "") == "python3.11");
}
