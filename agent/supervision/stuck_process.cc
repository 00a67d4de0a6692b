#include "agent/supervision/stuck_process.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "agent/processes/process_launcher.h"
#include "common/system.h"

namespace cpprun::agent {

namespace {

std::string readSmallFile(const std::string& path) {
  Result<std::string> text = readFile(path);
  return text.isOk() ? std::move(text).value() : std::string();
}

std::string trimNewline(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\0')) s.pop_back();
  return s;
}

}  // namespace

StuckProcess inspectProcess(pid_t pid) {
  StuckProcess p;
  p.pid = pid;
  p.state = processState(pid);
  if (p.state == 0) return p;
  const std::string dir = "/proc/" + std::to_string(pid);
  p.comm = trimNewline(readSmallFile(dir + "/comm"));
  p.wchan = trimNewline(readSmallFile(dir + "/wchan"));
  if (p.wchan == "0") p.wchan.clear();
  std::istringstream stack(readSmallFile(dir + "/stack"));
  for (std::string line; std::getline(stack, line);) {
    // "[<0>] do_wait+0x53/0x120": the address is hidden (0) unless kptr_restrict allows it.
    if (const size_t close = line.find("] "); line.rfind("[<", 0) == 0 && close != line.npos) {
      line = line.substr(close + 2);
    }
    if (!line.empty()) p.stack.push_back(line);
  }
  return p;
}

const char* stateWord(char state) {
  switch (state) {
    case 'R':
      return "running";
    case 'S':
      return "sleeping";
    case 'D':
      return "uninterruptible sleep";
    case 'Z':
      return "zombie";
    case 'T':
      return "stopped";
    case 't':
      return "tracing stop";
    case 'X':
      return "dead";
    case 'I':
      return "idle";
    default:
      return "";
  }
}

std::string describeStuck(const StuckProcess& p) {
  std::string text = "pid " + std::to_string(p.pid);
  if (!p.comm.empty()) text += " (" + p.comm + ")";
  if (p.state == 0) return text + " gone";
  text += " state " + std::string(1, p.state);
  if (*stateWord(p.state) != '\0') text += std::string(" (") + stateWord(p.state) + ")";
  text += ", wchan " + (p.wchan.empty() ? std::string("-") : p.wchan);
  return text;
}

nlohmann::json stuckToJson(const StuckProcess& p) {
  nlohmann::json j = {{"pid", p.pid},
                      {"comm", p.comm},
                      {"state", p.state == 0 ? std::string() : std::string(1, p.state)},
                      {"wchan", p.wchan}};
  if (!p.stack.empty()) j["stack"] = p.stack;
  return j;
}

std::optional<std::chrono::milliseconds> updateDwell(
    std::optional<std::chrono::steady_clock::time_point>& since, char state,
    std::chrono::steady_clock::time_point now) {
  if (state != 'D') {
    since.reset();
    return std::nullopt;
  }
  if (!since) since = now;
  return std::chrono::duration_cast<std::chrono::milliseconds>(now - *since);
}

std::chrono::milliseconds uninterruptibleCheckInterval(std::chrono::milliseconds timeout) {
  return std::clamp(timeout / 4, std::chrono::milliseconds(100), std::chrono::milliseconds(1000));
}

}  // namespace cpprun::agent
