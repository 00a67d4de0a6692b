#!/usr/bin/env bash
# Runs inside slurm_cluster.sh: submits BATCH_SCRIPT, waits for training to be under way (a
# second "Train Epoch" line in OUT), sends the job's steps SIGUSR1 the way `--signal=USR1@N`
# does at the time limit (`scancel --signal` delivers to the same tasks), then waits for the
# requeued job to complete. Prints the job's final record; exits non-zero on a timeout.
#
#   preempt_and_requeue.sh OUT BATCH_SCRIPT ARGS...
set -euo pipefail
out=$1
shift

# Slurm offers no event to wait on: poll the condition, with a bound.
wait_for() {
  local what=$1 seconds=$2
  shift 2
  local deadline=$((SECONDS + seconds))
  until "$@"; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "preempt_and_requeue.sh: timed out after ${seconds}s waiting for $what" >&2
      scontrol show job "${job:-}" >&2 || true
      cat "$out" >&2 || true
      return 1
    fi
    sleep 0.2
  done
}
training_started() { [ -f "$out" ] && [ "$(grep -c 'Train Epoch: 1 \[' "$out")" -ge 2 ]; }
job_state() { scontrol show job "$job" | grep -o 'JobState=[A-Z_]*' | cut -d= -f2; }
finished() { case "$(job_state)" in COMPLETED | FAILED | CANCELLED | TIMEOUT) return 0 ;; esac; return 1; }
requeued_once() { scontrol show job "$job" | grep -q 'Restarts=1'; }

job=$(sbatch --parsable -o "$out" "$@")
wait_for "training to start" 120 training_started
scancel --signal=USR1 "$job"
wait_for "the job to be requeued" 60 requeued_once
# Slurm holds a requeued batch job back for about two minutes (its begin time), as users see
# it. (Moving the start time to now raced with the first run's teardown: the restart failed.)
wait_for "the requeued job to finish" 300 finished
scontrol show job "$job"
