#pragma once
// A sweep as a Slurm job array (docs/scale-out.md): `kvtier sweep ... --slurm DIR` writes a job
// directory, `--submit` hands it to sbatch, each array task runs `kvtier sweep` on its slice of
// the grid into its own shard, `kvtier sweep --status DIR` says which points are done, killed,
// failed or missing, and `kvtier merge` joins the shards.
//
// The job directory, everything a task needs named in it:
//   grid.tsv        one line per point: index, array task, configuration hash, trace hash,
//                   trace path, label, the point's own overrides
//   job.sh          the sbatch array script: binary, experiment file, overrides, working
//                   directory, selection-memo directory; task t runs points [t*K, t*K+K) with
//                   `kvtier sweep ... --points A-B --grid DIR/grid.tsv --out DIR/shards/task-t.sqlite`
//   README          what to run: submit, status, resubmit, merge
//   shards/         task-<t>.sqlite, one results file per task (resumable like any sweep's)
//   logs/           Slurm's output files, <job id>_<task>.out
//
// Not thread-safe. Errors are InputErrors naming the file (exit 2).

#include <cstddef>
#include <string>
#include <vector>

namespace kvtier::cli {

// One point of a sweep's grid, in grid order.
struct GridPoint {
  std::string label;                // "spec cache.gpu_capacity=2GiB"
  std::vector<std::string> words;   // its own overrides: --include.system=spec --key=value ...
  std::string trace;                // resolved workload.trace
  std::string config_sha256;        // runs.config_sha256 of its run
  std::string trace_sha256;
};

struct SlurmJobOptions {
  std::string dir;
  std::string partition;  // "" = the cluster's default
  std::string time;       // "" = the partition's default; else sbatch's --time format
  int cpus_per_task = 1;  // also the task's sweep -j
  int points_per_task = 1;
};

// Writes the job directory `options.dir` (created; an existing grid.tsv of another grid is
// refused, one of the same grid is rewritten with its shards and logs kept, so a job
// directory can be regenerated after the binary moved). `sweep_words` are the words of the
// sweep command line that define the grid (--config, --systems, --set, overrides), written
// into job.sh as given; tasks run in the current directory (sbatch --chdir) so that relative
// paths resolve as they did here. Returns the number of array tasks.
int WriteSlurmJob(const SlurmJobOptions& options, const std::vector<std::string>& sweep_words,
                  const std::vector<GridPoint>& grid);

// Runs `sbatch --parsable [--array=ARRAY] DIR/job.sh` and returns the job id. Throws
// InputError with sbatch's message when it is missing or refuses the job.
std::string SubmitSlurmJob(const std::string& dir, const std::string& array = "");

// A line of grid.tsv.
struct GridLine {
  std::size_t point = 0;
  int task = 0;
  std::string config_sha256, trace_sha256, trace, label;
};
// Reads DIR/grid.tsv. Throws InputError naming file and line.
std::vector<GridLine> ReadGrid(const std::string& grid_path);

// Checks that the points a task is about to run are the ones `grid_path` lists: as many points
// in the grid, and each of [first, last] with the same configuration hash. Throws InputError
// naming the file and line of the first difference (the experiment, an include, an override
// or the trace changed since the job directory was written).
void CheckGrid(const std::string& grid_path, const std::vector<GridPoint>& grid,
               std::size_t first, std::size_t last);

// `kvtier sweep --status DIR`: prints every point that is not done (killed, failed, missing,
// queued or running), counts, and the sbatch command that resubmits the tasks of the missing
// and killed points. Returns 0 (the state is in what it prints; its last line is "all N points
// done" when there is nothing left to run).
int PrintSweepStatus(const std::string& dir);

}  // namespace kvtier::cli
