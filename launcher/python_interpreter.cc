#include "launcher/python_interpreter.h"

#include <unistd.h>

#include <filesystem>
#include <system_error>

namespace cpprun::launcher {

namespace fs = std::filesystem;

namespace {

bool isEnvironment(const fs::path& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir / "pyvenv.cfg", ec) || fs::is_directory(dir / "conda-meta", ec);
}

std::string pythonIn(const fs::path& bin) {
  std::error_code ec;
  for (const char* name : {"python3", "python"}) {
    const fs::path candidate = bin / name;
    if (::access(candidate.c_str(), X_OK) == 0 && !fs::is_directory(candidate, ec)) {
      return candidate.string();
    }
  }
  return "";
}

}  // namespace

std::string environmentPython(const std::string& executable) {
  if (executable.empty()) return "";
  const fs::path dir = fs::path(executable).parent_path();
  // <env>/bin/cpprun: the executable's own directory is the environment's bin/.
  if (isEnvironment(dir.parent_path())) return pythonIn(dir);
  // <env>/lib/pythonX.Y/site-packages/<dir>/cpprun: inside an installed package (a wheel
  // repaired by auditwheel keeps it there, behind a bin/cpprun script that executes it).
  fs::path up = dir;
  bool in_site_packages = false;
  for (int level = 0; level < 4 && up.has_relative_path(); ++level) {
    in_site_packages = in_site_packages || up.filename() == "site-packages";
    up = up.parent_path();
    if (in_site_packages && isEnvironment(up)) return pythonIn(up / "bin");
  }
  return "";
}

std::string pythonInterpreter(const std::map<std::string, std::string>& agent_env,
                              const std::string& executable) {
  if (auto it = agent_env.find("PYTHON_EXEC"); it != agent_env.end()) return it->second;
  std::string env_python = environmentPython(executable);
  return env_python.empty() ? "python3" : env_python;
}

std::string selfExecutable() {
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : self.string();
}

}  // namespace cpprun::launcher
