#include "launcher/python_interpreter.h"

#include <unistd.h>

#include <filesystem>
#include <system_error>

namespace cpprun::launcher {

namespace fs = std::filesystem;

std::string environmentPython(const std::string& executable) {
  if (executable.empty()) return "";
  const fs::path bin = fs::path(executable).parent_path();
  const fs::path env = bin.parent_path();
  std::error_code ec;
  const bool venv = fs::is_regular_file(env / "pyvenv.cfg", ec);
  const bool conda = fs::is_directory(env / "conda-meta", ec);
  if (!venv && !conda) return "";
  for (const char* name : {"python3", "python"}) {
    const fs::path candidate = bin / name;
    if (::access(candidate.c_str(), X_OK) == 0 && !fs::is_directory(candidate, ec)) {
      return candidate.string();
    }
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
