// docs/torchrun-compatibility.md, executable: every row of its tables is checked against torch
// 2.15's own torchrun and against cpprun, so a row that stops being true fails CI.
//
//   * torchrun's side comes from torch itself: tests/torch/torchrun_facts.py (run by the venv's
//     interpreter) dumps its argument parser (every option, default, choices, PET_ fallback) and
//     the environment variable names its launcher code reads or sets; rows that only its source
//     can show cite that source (`torch/<path>: <text>` in the row's "Checked by" column, which
//     must still be there, verbatim).
//   * cpprun's side comes from its option table (launcher/cli.h's optionRows), its parser, its
//     sources (a variable cpprun "does not support" must not be read there) and its tests: every
//     test a row names in "Checked by" must exist (a name in this binary, or `<binary>: <name>`
//     for another test binary), and CI runs it.
//
// What a status must mean:
//   * flags: "not supported" exactly when cpprun's table rejects the option; "same" only when
//     cpprun reads the same PET_ variable, accepts every choice torchrun offers and — for a
//     default torchrun spells as a value — parsing the option at torchrun's default leaves cpprun's
//     whole configuration as it was without it; "different" names its evidence.
//   * variables: every TORCHELASTIC_*/TORCH_ELASTIC_* name and every variable torchrun's launcher
//     code reads has a row; "not supported" only when cpprun's sources never name it, "same" and
//     "different" only when they do; "different" names its evidence.
//   * the environment table (torchrun vs cpprun): the variables it marks as differing are exactly
//     those the differential test allows to differ (tests/support/torchrun_env_differences.h).
//   * the deliberate behaviour differences and the exit codes: each row names its evidence.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/system.h"
#include "launcher/cli.h"
#include "tests/support/test_support.h"
#include "tests/support/torch_peers.h"
#include "tests/support/torchrun_env_differences.h"

namespace {

using namespace cpprun::testing;
using Json = nlohmann::json;
namespace fs = std::filesystem;
using cpprun::launcher::LaunchConfig;
using cpprun::launcher::parseCommandLine;

const std::string kDoc = std::string(CPPRUN_SOURCE_DIR) + "/docs/torchrun-compatibility.md";

std::string slurp(const fs::path& path) {
  cpprun::Result<std::string> text = cpprun::readFile(path.string());
  return text.isOk() ? std::move(text).value() : std::string();
}

std::string trim(std::string s) {
  const auto first = s.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  return s.substr(first, s.find_last_not_of(" \t") - first + 1);
}

struct Row {
  int line = 0;
  std::vector<std::string> cells;
  std::string where() const { return "docs/torchrun-compatibility.md:" + std::to_string(line); }
};

// The cells of one markdown table line; `\|` is a '|' inside a cell.
std::vector<std::string> splitCells(const std::string& line) {
  std::vector<std::string> cells;
  std::string cell;
  for (size_t i = 1; i < line.size(); ++i) {
    if (line[i] == '\\' && i + 1 < line.size() && line[i + 1] == '|') {
      cell += '|';
      ++i;
    } else if (line[i] == '|') {
      cells.push_back(trim(cell));
      cell.clear();
    } else {
      cell += line[i];
    }
  }
  return cells;
}

// The body rows of the first table after the first line that contains `marker`.
std::vector<Row> tableAfter(const std::string& doc, const std::string& marker) {
  std::istringstream in(doc);
  std::string line;
  int number = 0;
  bool found = false;
  bool in_table = false;
  int header_lines = 0;
  std::vector<Row> rows;
  while (std::getline(in, line)) {
    ++number;
    if (!found) {
      found = line.find(marker) != std::string::npos;
      continue;
    }
    if (line.rfind("|", 0) == 0) {
      in_table = true;
      if (header_lines++ < 2) continue;  // the header and its |---| line
      rows.push_back({number, splitCells(line)});
    } else if (in_table) {
      break;
    }
  }
  INFO("table after \"" << marker << "\" in " << kDoc);
  REQUIRE(!rows.empty());
  return rows;
}

std::vector<std::string> backticked(const std::string& cell) {
  std::vector<std::string> spans;
  static const std::regex span("`([^`]+)`");
  for (std::sregex_iterator it(cell.begin(), cell.end(), span), end; it != end; ++it) {
    spans.push_back((*it)[1]);
  }
  return spans;
}

std::vector<std::string> longOptionsIn(const std::string& cell) {
  std::vector<std::string> names;
  static const std::regex option("(--[a-z][a-z0-9-]*)");
  for (std::sregex_iterator it(cell.begin(), cell.end(), option), end; it != end; ++it) {
    names.push_back((*it)[1]);
  }
  return names;
}

// torch 2.15's torchrun, as tests/torch/torchrun_facts.py reports it (once per test binary).
const Json& torchrunFacts() {
  static const Json facts = [] {
    TempDir dir;
    const std::string out = dir.path() + "/facts.json";
    ChildProcess probe({CPPRUN_TORCH2_PYTHON,
                        std::string(CPPRUN_SOURCE_DIR) + "/tests/torch/torchrun_facts.py", out});
    auto status = probe.wait(std::chrono::seconds(60));
    INFO(probe.output());
    REQUIRE(status.has_value());
    REQUIRE(exitCodeOf(*status) == 0);
    return Json::parse(slurp(out));
  }();
  return facts;
}

// torchrun's option whose names include `name`, or null.
Json torchrunOption(const std::string& name) {
  for (const Json& option : torchrunFacts()["options"]) {
    for (const Json& n : option["names"]) {
      if (n.get<std::string>() == name) return option;
    }
  }
  return nullptr;
}

std::optional<cpprun::launcher::internal::OptionRow> cpprunOption(const std::string& name) {
  for (const auto& row : cpprun::launcher::internal::optionRows()) {
    if (row.name == name) return row;
  }
  return std::nullopt;
}

// The test names of another test binary (built beside this one).
const std::set<std::string>& testNamesOf(const std::string& binary) {
  static std::map<std::string, std::set<std::string>> cache;
  auto it = cache.find(binary);
  if (it != cache.end()) return it->second;
  const fs::path self = fs::read_symlink("/proc/self/exe");
  ChildProcess list({(self.parent_path() / binary).string(), "--list-test-names-only"});
  auto status = list.wait(std::chrono::seconds(30));
  REQUIRE(status.has_value());
  std::set<std::string> names;
  std::istringstream in(list.output());
  std::string line;
  while (std::getline(in, line)) {
    if (!trim(line).empty()) names.insert(trim(line));
  }
  return cache.emplace(binary, std::move(names)).first->second;
}

bool testHere(const std::string& name) {
  for (const Catch::TestCase& test :
       Catch::getAllTestCasesSorted(*Catch::getCurrentContext().getConfig())) {
    if (test.getTestCaseInfo().name == name) return true;
  }
  return false;
}

// Checks every entry of a "Checked by" cell; returns how many there are.
size_t checkEvidence(const Row& row, const std::string& cell) {
  static const std::regex other_binary("([a-z0-9_]+_tests): (.+)");
  size_t count = 0;
  for (const std::string& entry : backticked(cell)) {
    INFO(row.where() << ": evidence `" << entry << "`");
    std::smatch m;
    if (entry.rfind("torch/", 0) == 0) {
      const size_t colon = entry.find(": ");
      REQUIRE(colon != std::string::npos);
      const fs::path file =
          fs::path(torchrunFacts()["torch_dir"].get<std::string>()).parent_path() /
          entry.substr(0, colon);
      const std::string text = entry.substr(colon + 2);
      INFO("torch 2.15's " << file << " must still say: " << text);
      CHECK(slurp(file).find(text) != std::string::npos);
    } else if (std::regex_match(entry, m, other_binary)) {
      CHECK(testNamesOf(m[1]).count(m[2]) == 1);
    } else {
      CHECK(testHere(entry));
    }
    ++count;
  }
  return count;
}

template <typename T>
std::string text(const T& v) {
  std::ostringstream s;
  s << v;
  return s.str();
}
template <typename T>
std::string text(const std::vector<T>& v) {
  std::string out;
  for (const auto& e : v) out += text(e) + ",";
  return out;
}
template <typename K, typename V>
std::string text(const std::map<K, V>& m) {
  std::string out;
  for (const auto& [k, v] : m) out += text(k) + "=" + text(v) + ",";
  return out;
}

// Every option-derived field of a parsed configuration, as text: two parses are the same
// configuration when their descriptions are equal. (Which options were given, and from where,
// is left out: giving an option at its default changes only that.)
std::string describe(const LaunchConfig& c) {
  std::ostringstream s;
  s << c.min_nodes << '|' << c.max_nodes << '|' << static_cast<int>(c.nproc_kind) << '|' << c.nproc
    << '|' << c.rdzv_backend << '|' << c.rdzv_endpoint << '|' << c.rdzv_id << '|'
    << text(c.rdzv_conf) << '|' << c.standalone << '|' << c.max_restarts << '|'
    << c.monitor_interval << '|' << c.start_method << '|' << c.role << '|' << c.module << '|'
    << c.no_python << '|' << c.run_path << '|' << c.log_dir << '|' << c.redirects_default << '|'
    << text(c.redirects_by_rank) << '|' << c.tee_default << '|' << text(c.tee_by_rank) << '|'
    << text(c.local_ranks_filter) << '|' << c.log_line_prefix_template << '|' << c.node_rank << '|'
    << c.master_addr << '|' << c.master_port << '|' << c.master_port_given << '|' << c.local_addr
    << '|' << text(c.signals_to_handle) << '|' << c.shutdown_timeout << '|' << c.virtual_local_rank
    << '|' << c.numa_binding << '|' << c.event_log_handler << '|'
    << text(c.duplicate_stdout_filters) << '|' << text(c.duplicate_stderr_filters) << '|'
    << c.worker_tty << '|' << c.stdin_mode << '|' << c.raw_output << '|' << c.entrypoint << '|'
    << text(c.entrypoint_args);
  return s.str();
}

std::optional<std::string> parsedDescription(std::vector<std::string> args) {
  args.push_back("train.py");
  auto parsed = parseCommandLine(args, {});
  if (!parsed.isOk()) return std::nullopt;
  return describe(parsed.value().config);
}

std::string valueText(const Json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_number_integer()) return std::to_string(value.get<long long>());
  std::ostringstream s;
  s << value.get<double>();
  return s.str();
}

// Every source file of cpprun itself (not its tests or docs), concatenated.
const std::string& cpprunSources() {
  static const std::string text = [] {
    std::string all;
    for (const char* dir : {"common", "rendezvous", "agent", "launcher"}) {
      for (const auto& entry :
           fs::recursive_directory_iterator(fs::path(CPPRUN_SOURCE_DIR) / dir)) {
        const std::string ext = entry.path().extension();
        if (ext == ".cc" || ext == ".h") all += slurp(entry.path());
      }
    }
    return all;
  }();
  return text;
}

const std::set<std::string> kStatuses = {"same", "different", "not supported", "cpprun only"};

}  // namespace

TEST_CASE("docs/torchrun-compatibility.md: every torchrun 2.15 flag has a row and each row is true",
          "[torch2][docs]") {
  requireTorchPeer(torch2());
  const std::string doc = slurp(kDoc);
  std::set<std::string> documented;
  for (const Row& row : tableAfter(doc, "## Flags")) {
    INFO(row.where() << ": " << (row.cells.empty() ? "" : row.cells[0]));
    REQUIRE(row.cells.size() == 4);
    const std::string status = row.cells[1];
    CHECK((status == "same" || status == "different" || status == "not supported"));
    const auto names = longOptionsIn(row.cells[0]);
    REQUIRE(!names.empty());
    const std::string name = names.back();  // "-m, --module": the long one
    const Json torch_option = torchrunOption(name);
    {
      INFO("a row for an option torchrun 2.15 does not have");
      REQUIRE(!torch_option.is_null());
    }
    documented.insert(name);
    const auto ours = cpprunOption(name);
    REQUIRE(ours.has_value());
    CHECK((status == "not supported") == !ours->supported);
    const size_t evidence = checkEvidence(row, row.cells[3]);
    if (!ours->supported) continue;

    std::vector<std::string> differences;
    if (torch_option["pet"].get<bool>() != !ours->env_var.empty()) {
      differences.push_back("PET_ fallback");
    }
    for (const Json& choice : torch_option["choices"]) {
      auto parsed = parseCommandLine({name + "=" + choice.get<std::string>(), "train.py"}, {});
      if (!parsed.isOk()) differences.push_back("refuses " + choice.get<std::string>());
    }
    const Json& value = torch_option["default"];
    if (!torch_option["flag"].get<bool>() && (value.is_string() || value.is_number())) {
      const auto with_default = parsedDescription({name + "=" + valueText(value)});
      if (!with_default) {
        differences.push_back("refuses torchrun's default " + valueText(value));
      } else if (*with_default != *parsedDescription({})) {
        differences.push_back("torchrun's default " + valueText(value) + " is not cpprun's");
      }
    }
    std::string found;
    for (const auto& d : differences) found += d + "; ";
    INFO("found against torchrun 2.15's parser: " << found);
    if (status == "same") CHECK(differences.empty());
    if (status == "different") CHECK(differences.size() + evidence > 0);
  }
  for (const Json& option : torchrunFacts()["options"]) {
    const std::string name = option["names"].back().get<std::string>();
    const std::string dashed = std::regex_replace(name, std::regex("_"), "-");
    INFO("torchrun 2.15's " << dashed << " has no row");
    CHECK(documented.count(dashed) == 1);
  }
}

TEST_CASE("docs/torchrun-compatibility.md: cpprun's own options are exactly its option table's",
          "[unit][docs]") {
  std::set<std::string> documented;
  for (const Row& row : tableAfter(slurp(kDoc), "cpprun's own options (no `PET_` fallback):")) {
    REQUIRE(!row.cells.empty());
    for (const std::string& name : longOptionsIn(row.cells[0])) {
      if (name != "--help" && name != "--version") documented.insert(name);
      break;
    }
  }
  std::set<std::string> own;
  for (const auto& row : cpprun::launcher::internal::optionRows()) {
    const bool usage = row.name == "--help" || row.name == "--version";
    if (row.supported && row.env_var.empty() && !usage) own.insert(row.name);
  }
  // torchrun's options without a PET_ variable are rows of the torchrun table instead.
  for (const char* torchrun_only : {"--numa-binding", "--logs-specs"}) own.erase(torchrun_only);
  CHECK(documented == own);
}

TEST_CASE(
    "docs/torchrun-compatibility.md: every variable torchrun 2.15's launcher uses has a row "
    "and each row is true",
    "[torch2][docs]") {
  requireTorchPeer(torch2());
  const std::string doc = slurp(kDoc);
  std::set<std::string> torch_names;
  for (const Json& n : torchrunFacts()["environment"]) torch_names.insert(n.get<std::string>());
  for (const Row& row : tableAfter(doc, "Read by the launcher itself")) {
    INFO(row.where() << ": " << (row.cells.empty() ? "" : row.cells[0]));
    REQUIRE(row.cells.size() == 4);
    const std::string status = row.cells[1];
    CHECK(kStatuses.count(status) == 1);
    const size_t evidence = checkEvidence(row, row.cells[3]);
    if (status == "different") CHECK(evidence > 0);
    for (const std::string& name : backticked(row.cells[0])) {
      if (name.rfind("PET_", 0) == 0) continue;  // the flags' fallback, checked with the flags
      INFO("variable " << name);
      const bool in_cpprun = cpprunSources().find('"' + name + '"') != std::string::npos;
      if (status == "cpprun only") {
        CHECK(torch_names.count(name) == 0);
      } else {
        CHECK(torch_names.count(name) == 1);
      }
      CHECK(in_cpprun == (status != "not supported"));
    }
  }
  // Coverage: every name torch's launcher code reads or sets appears in the page.
  for (const std::string& name : torch_names) {
    INFO("torchrun 2.15's launcher uses " << name
                                          << "; docs/torchrun-compatibility.md does not say");
    CHECK(doc.find('`' + name + '`') != std::string::npos);
  }
}

TEST_CASE(
    "docs/torchrun-compatibility.md: the worker variables it marks as differing are the ones "
    "the differential test allows",
    "[unit][docs]") {
  std::set<std::string> marked;
  for (const Row& row : tableAfter(slurp(kDoc), "| Variable | torchrun 2.15 | cpprun | Status |")) {
    INFO(row.where());
    REQUIRE(row.cells.size() == 4);
    const std::string& status = row.cells[3];
    const bool differs =
        status.rfind("differs-because", 0) == 0 || status.rfind("cpprun only", 0) == 0;
    if (!differs) continue;
    // The variables the row is about: those named before any parenthesis.
    for (const std::string& name : backticked(row.cells[0].substr(0, row.cells[0].find('(')))) {
      if (std::regex_match(name, std::regex("[A-Z][A-Z0-9_]*"))) marked.insert(name);
    }
  }
  std::set<std::string> expected = envDifferencesAllowed();
  expected.insert(envDifferencesNormalised().begin(), envDifferencesNormalised().end());
  CHECK(marked == expected);
}

TEST_CASE(
    "docs/torchrun-compatibility.md: every deliberate difference names the test that checks it",
    "[torch2][docs]") {
  requireTorchPeer(torch2());
  for (const Row& row : tableAfter(slurp(kDoc), "## Behaviour that differs on purpose")) {
    INFO(row.where() << ": " << (row.cells.size() > 1 ? row.cells[1] : ""));
    REQUIRE(row.cells.size() == 3);
    CHECK(checkEvidence(row, row.cells[2]) > 0);
  }
}

TEST_CASE("docs/torchrun-compatibility.md: every exit code row names the test that checks it",
          "[torch2][docs]") {
  requireTorchPeer(torch2());
  for (const Row& row : tableAfter(slurp(kDoc), "| Code | cpprun | torchrun |")) {
    INFO(row.where() << ": exit code " << (row.cells.empty() ? "" : row.cells[0]));
    REQUIRE(row.cells.size() == 4);
    CHECK(checkEvidence(row, row.cells[3]) > 0);
  }
}
