// SchedulerEnvironment: what the job's launcher (Slurm's srun, Open MPI's mpirun, a PMI or PMIx
// launcher, MVAPICH, Flux, LSF's jsrun) tells this agent through its environment: which agent
// it is, how many agents the job has, the job's hosts, a job id and a rendezvous endpoint. Every
// value carries its source ("SLURM_PROCID"), which `cpprun --dry-run` prints.
//
// Flags win: applySchedulerEnvironment() fills only the options the command line and the PET_
// variables left out. See docs/rendezvous.md ("Scheduler discovery").
// Thread safety: pure functions on values.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "launcher/launch_config.h"

namespace cpprun::launcher {

template <typename T>
struct Discovered {
  T value{};
  std::string source;  // where it came from, e.g. "SLURM_PROCID=3"
};

struct SchedulerEnvironment {
  std::string scheduler;  // "slurm", "openmpi", "pmi", "pmix", "mvapich", "flux", "jsm"; "" none
  std::optional<Discovered<int>> agent_rank;   // this agent's rank among the job's agents
  std::optional<Discovered<int>> agent_count;  // agents in the job
  std::optional<Discovered<std::vector<std::string>>> hosts;  // the step's hosts, in order
  std::optional<Discovered<std::string>> endpoint_host;       // where agent 0 serves the store
  std::optional<Discovered<int>> endpoint_port;
  std::optional<Discovered<std::string>> run_id;
  std::vector<std::string> notes;  // choices worth a log line
};

// Reads the environment. An error when a scheduler's variable is malformed (a bad hostlist,
// a rank that is not a number), naming the variable.
Result<SchedulerEnvironment> discoverScheduler(const std::map<std::string, std::string>& env);

// The port a Slurm job uses when none is given: 10000 + job id % 20000, below Linux's
// ephemeral range so the kernel never hands it out to another connection.
int portForSlurmJob(unsigned long long job_id);

// What came from where, for --dry-run: option name -> source.
using Provenance = std::map<std::string, std::string>;

// Fills the rendezvous options of `config` that the user did not give (config.given) from
// `sched`, and records each in `provenance`. An error when the result is inconsistent (an
// agent rank outside the agent count).
Status applySchedulerEnvironment(const SchedulerEnvironment& sched, LaunchConfig& config,
                                 Provenance& provenance);

}  // namespace cpprun::launcher
