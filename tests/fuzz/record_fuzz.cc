// libFuzzer target: arbitrary bytes as every record the agents read from a store (job_keys.h):
// a stop claim, a node's report, a decision, a join record, a round's members document, a slot's
// assignment, a rank's state at a stall. Anyone who can reach the store can write these bytes.
//
// Checks: no exception escapes a decoder (one would abort here, as it aborted agents before
// issue 36), no crash, no sanitizer report; a record that decodes re-encodes to one that decodes
// to the same fields (the writer and the reader agree on every record the reader accepts); what
// a decoded record holds stays within the bounds the reader promises.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "agent/coordination/job_keys.h"
#include "agent/supervision/record_reader.h"
#include "agent/supervision/stall_verdict.h"
#include "common/job_limits.h"

namespace {

using namespace cpprun;
using namespace cpprun::agent;
using nlohmann::json;

void require(bool ok) {
  if (!ok) std::abort();
}

void stopClaim(std::string_view bytes) {
  Result<StopClaim> stop = stopFromRecord(bytes, "attempt/0/stop");
  if (!stop.isOk()) return;
  require(stop.value().by >= kByNobody && stop.value().by < kMaxNodes);
  Result<StopClaim> again = stopFromJson(stopToJson(stop.value()));
  require(again.isOk() && again.value().by == stop.value().by &&
          again.value().cause == stop.value().cause && again.value().reason == stop.value().reason);
}

void report(std::string_view bytes) {
  Result<AttemptReport> r = reportFromRecord(bytes, "attempt/0/report/0");
  if (!r.isOk()) return;
  require(r.value().failures.size() <= static_cast<size_t>(kMaxWorkersPerNode));
  require(r.value().rank_states.size() <= kMaxReportedRankStates);
  Result<AttemptReport> again = reportFromJson(reportToJson(r.value(), "h"));
  require(again.isOk() && again.value().kind == r.value().kind &&
          again.value().failures.size() == r.value().failures.size());
}

void decision(std::string_view bytes) {
  Result<DecisionRecord> d = decisionFromRecord(bytes, "attempt/0/decision", 2);
  if (!d.isOk()) return;
  require(d.value().readers >= 0 && d.value().readers <= kMaxNodes);
  Result<DecisionRecord> again =
      decisionFromJson(decisionToJson(d.value().decision, d.value().readers), 2);
  require(again.isOk() && again.value().decision.kind == d.value().decision.kind &&
          again.value().readers == d.value().readers);
}

void joinRecord(std::string_view bytes) {
  Result<RoundMember> m = decodeRecord(bytes, "rdzv/round/0/agent/1", [](const json& doc) {
    return roundMemberFromRecord(doc, 1, "rdzv/round/0/agent/1");
  });
  if (!m.isOk()) return;
  require(m.value().agent.nproc >= 1 && m.value().agent.nproc <= kMaxWorkersPerNode);
  Result<AgentInfo> again =
      agentFromRecord(agentRecord(m.value().agent, m.value().previous_rank), "again");
  require(again.isOk() && again.value().nproc == m.value().agent.nproc &&
          again.value().id == m.value().agent.id);
}

void members(std::string_view bytes) {
  const json doc = parseRecord(bytes);
  Result<RoundDocument> d = roundDocumentFromJson(doc, 3);
  if (d.isOk() && d.value().kind == RoundDocument::Kind::kMembers) {
    int64_t world = 0;
    for (const AgentInfo& a : d.value().members.agents) world += a.nproc;
    require(world <= kMaxWorldSize);
    require(d.value().members.agents.size() == d.value().members.slots.size());
  }
  // The closer publishes every slot's assignment from a validated document (or an error or
  // job_over one): each must decode.
  if (d.isOk()) {
    for (const std::string& a : roundAssignments(doc, 3, 4)) {
      require(assignmentFromJson(parseRecord(a), "assignment").isOk());
    }
  }
}

void assignment(std::string_view bytes) {
  Result<RoundAssignment> a = decodeRecord(bytes, "rdzv/round/0/assigned/1", [](const json& doc) {
    return assignmentFromJson(doc, "rdzv/round/0/assigned/1");
  });
  if (!a.isOk() || a.value().kind != RoundAssignment::Kind::kMember) return;
  const Membership& m = a.value().membership;
  require(m.group_rank >= 0 && m.group_rank < m.group_world_size);
  require(m.base_rank >= 0 && m.base_rank < m.world_size);
  require(assignmentFromJson(assignmentToJson(a.value()), "again").isOk());
}

void rankState(std::string_view bytes) {
  const json doc = parseRecord(bytes);
  Result<RankState> s = rankStateFromJson(doc, "a rank's state");
  if (!s.isOk()) return;
  require(rankStateFromJson(rankStateToJson(s.value()), "again").isOk());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // The first byte picks the record type (so one corpus serves all), the rest is the record.
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    switch (data[0] % 7) {
      case 0:
        stopClaim(bytes);
        break;
      case 1:
        report(bytes);
        break;
      case 2:
        decision(bytes);
        break;
      case 3:
        joinRecord(bytes);
        break;
      case 4:
        members(bytes);
        break;
      case 5:
        assignment(bytes);
        break;
      default:
        rankState(bytes);
        break;
    }
  } catch (...) {
    std::abort();  // an exception from a decoder: what aborted agents before
  }
  return 0;
}
