// Which Python runs a worker's .py or -m entry point.
//
// torchrun runs workers with sys.executable, the interpreter of the environment torchrun was
// installed in. cpprun's rule (docs/environment.md, "Which Python"):
//   1. PYTHON_EXEC from the agent's environment, when set;
//   2. else, when cpprun's own executable lies in a Python environment — a virtual environment
//      (has pyvenv.cfg) or a conda environment (has conda-meta/) — either in its bin/ or in a
//      package under its lib/pythonX.Y/site-packages/ (where auditwheel's repair moves it, behind
//      a bin/cpprun script), the environment's bin/python3 (else bin/python), by its path in
//      the environment, not resolved through symlinks (a venv's python is a symlink to the base
//      interpreter; only the venv's path gives the venv's sys.path);
//   3. else `python3`, found on PATH when the worker is executed.
//
// Thread safety: pure functions, except selfExecutable (reads /proc/self/exe).
#pragma once

#include <map>
#include <string>

namespace cpprun::launcher {

// Rule 2 alone: the interpreter of the environment `executable` (an absolute path) lies in, or
// "" when it lies in none (or the environment has no executable python3 or python).
std::string environmentPython(const std::string& executable);

// The whole rule: PYTHON_EXEC, else environmentPython(executable), else "python3".
std::string pythonInterpreter(const std::map<std::string, std::string>& agent_env,
                              const std::string& executable);

// This process's executable (/proc/self/exe), "" when it cannot be read.
std::string selfExecutable();

}  // namespace cpprun::launcher
