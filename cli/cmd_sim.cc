// kvtier sim: replay a trace through one or more systems in the simulator and compare them.
//
//   kvtier sim --config configs/experiments/X.ini [--systems a,b,c] --out R.sqlite
//              [--jobs N] [--section.key=value ...]      (flags: cli/experiment_args.h)
//
// Each system runs in its own child process (SimGrid starts clean each time) and writes one
// run into the same SQLite file; the parent prints a comparison table from the run_summary
// view. Every system's configuration is validated before any simulation starts.

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <sstream>

#include "analysis/queries.h"
#include "analysis/results_db.h"
#include "cli/commands.h"
#include "cli/experiment_args.h"
#include "cli/sim_common.h"
#include "core/config.h"
#include "core/errors.h"
#include "core/input_file.h"
#include "core/options.h"
#include "sim/simulate.h"
#include "traces/trace_io.h"

namespace kvtier::cli {

namespace {

volatile std::sig_atomic_t g_stop_signal = 0;

extern "C" void OnStopSignal(int sig) {
  if (g_stop_signal == 0) {
    g_stop_signal = sig;
    ::alarm(10);  // the request in progress gets 10 s to end; then SIGALRM ends the process
  }
}

}  // namespace

Interrupted::Interrupted(int signal)
    : std::runtime_error(std::string("stopped by ") + strsignal(signal) +
                         " between requests; the run stays incomplete"),
      signal_(signal) {}

StopSignals::StopSignals() {
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) ::sigaction(sig, &sa, nullptr);
}

StopSignals::~StopSignals() {
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) std::signal(sig, SIG_DFL);
}

void StopSignals::Check() const {
  if (g_stop_signal != 0) throw Interrupted(g_stop_signal);
}

namespace {

// One run in a child process: progress lines every `progress_s` (or a Progress with rate and
// ETA when `rate_eta` is given), the summary, and the run id back to the parent through
// `result_fd`. Returns the child's exit code.
int RunChild(const ChildFn& child, const Config& config, const std::string& label,
             const char* command, double progress_s, const ProgressOptions* rate_eta,
             int result_fd) {
  auto last = std::chrono::steady_clock::now();
  std::unique_ptr<Progress> bar;  // created at the first call, when the total is known
  auto progress = [&](long long done, long long total, double t) {
    if (rate_eta != nullptr) {
      if (bar == nullptr) {
        // A trace without a `requests` header entry: its end marker's count (run.max_requests
        // caps it), so the line has an ETA.
        if (total == 0) {
          total = TraceRecordCountHint(config.GetString("workload.trace"));
          const long long cap = config.GetInt("run.max_requests");
          if (cap > 0 && (total == 0 || total > cap)) total = cap;
        }
        bar = std::make_unique<Progress>(std::string(command) + " " + label, "requests", total,
                                         *rate_eta);
      }
      char at[48];
      std::snprintf(at, sizeof at, "at %.2f s", t);
      bar->Update(done, at);
      return;
    }
    auto now = std::chrono::steady_clock::now();
    if (std::chrono::duration<double>(now - last).count() < progress_s) return;
    last = now;
    if (total > 0) {
      std::fprintf(stderr, "  %-12s %lld/%lld requests (%.0f%%), at %.1f s\n", label.c_str(),
                   done, total, 100.0 * double(done) / double(total), t);
    } else {
      std::fprintf(stderr, "  %-12s %lld requests, at %.1f s\n", label.c_str(), done, t);
    }
  };
  try {
    const ChildRun r = child(config, progress);
    if (bar != nullptr) bar->Finish();
    if (rate_eta == nullptr || !rate_eta->quiet) {
      std::fprintf(stderr, "  %-12s done: %s\n", label.c_str(), r.summary.c_str());
    }
    const std::string id = std::to_string(r.run_id) + "\n";
    if (write(result_fd, id.data(), id.size()) < 0) return 1;
    return 0;
  } catch (const Interrupted& e) {
    bar.reset();
    std::fprintf(stderr, "kvtier %s (%s): %s\n", command, label.c_str(), e.what());
    return 128 + e.signal();
  } catch (const InputError& e) {
    bar.reset();  // ends an open terminal progress line before the message
    std::fprintf(stderr, "kvtier %s (%s): error: %s\n", command, label.c_str(), e.what());
    return kExitBadInput;
  } catch (const RunFailed& e) {
    bar.reset();
    std::fprintf(stderr, "kvtier %s (%s): run failed: %s\n", command, label.c_str(), e.what());
    return kExitRunFailed;
  } catch (const std::exception& e) {
    bar.reset();
    std::fprintf(stderr, "kvtier %s (%s): internal error: %s\n", command, label.c_str(),
                 e.what());
    return 1;
  }
}

}  // namespace

ChildFn SimChild(const std::string& out) {
  return [out](const Config& config, const ProgressFn& progress) {
    const std::string trace = config.GetString("workload.trace");  // resolved by the caller
    sim::SimulationResult r = sim::RunSimulation(config, trace, out, progress);
    char buf[160];
    std::snprintf(buf, sizeof buf, "%lld requests, %.1f s simulated, %.2f s wall (%.0f req/s)",
                  r.requests, r.simulated_s, r.wall_s,
                  r.wall_s > 0 ? double(r.requests) / r.wall_s : 0.0);
    std::string summary = buf;
    if (r.memo_reused_layers > 0) {  // say why a rerun is faster than the first run
      summary += "; ITF decisions of " + std::to_string(r.memo_reused_layers) + " of " +
                 std::to_string(r.memo_reused_layers + r.memo_computed_layers) +
                 " layers from the selection memo";
    }
    if (r.h2o_memo_reused_layers > 0) {
      summary += "; H2O selections of " + std::to_string(r.h2o_memo_reused_layers) + " of " +
                 std::to_string(r.h2o_memo_reused_layers + r.h2o_memo_computed_layers) +
                 " layers from the selection memo";
    }
    return ChildRun{r.run_id, summary};
  };
}

void AddSimProgressFlags(ExperimentArgs* a, bool* progress, bool* quiet) {
  a->AddOptions()("progress", boost::program_options::bool_switch(progress),
                  "rate and ETA of each run on stderr even when it is not a terminal")(
      "quiet", boost::program_options::bool_switch(quiet), "no progress on stderr");
}

bool SimProgressOptions(double interval_s, int jobs, bool asked, bool quiet, ProgressOptions* o) {
  *o = ProgressOptions{};
  o->interval_s = interval_s;
  o->quiet = quiet;
  if (jobs > 1) o->style = ProgressOptions::Style::kLines;
  return quiet || asked || ::isatty(::fileno(stderr)) == 1;
}

namespace {

// The signals that stop a parent of child runs, and with it its children.
constexpr int kStopSignals[] = {SIGTERM, SIGINT, SIGHUP};
// How long stopped children may take to end (an hw child finishes its request and removes its
// chunk store) before they are killed.
constexpr int kChildGraceSeconds = 10;

// In a fresh child: die with the parent however the parent dies (SIGKILL included; the kernel
// sends SIGTERM when it exits), with default signal dispositions and the parent's old mask.
// The getppid check catches a parent that died between fork and prctl.
void SetUpChild(pid_t parent, const sigset_t& old_mask) {
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() != parent) _exit(128 + SIGTERM);
  for (int sig : kStopSignals) std::signal(sig, SIG_DFL);
  ::sigprocmask(SIG_SETMASK, &old_mask, nullptr);
}

}  // namespace

std::vector<long long> RunInChildren(const std::vector<std::pair<std::string, Config>>& runs,
                                     int jobs, double progress_s, const char* command,
                                     const ChildFn& child, int* worst_exit,
                                     const DoneFn& on_done, const ProgressOptions* rate_eta) {
  std::vector<long long> run_ids;
  std::map<pid_t, int> children;  // pid -> read end of its result pipe
  std::map<pid_t, std::string> labels;
  std::size_t next = 0;
  *worst_exit = 0;
  // SIGCHLD and the stop signals are blocked and taken with sigtimedwait, so a stop signal is
  // never lost between a check and a wait; children get the old mask back.
  sigset_t wait_set, old_mask;
  sigemptyset(&wait_set);
  sigaddset(&wait_set, SIGCHLD);
  for (int sig : kStopSignals) sigaddset(&wait_set, sig);
  ::sigprocmask(SIG_BLOCK, &wait_set, &old_mask);
  struct MaskRestore {
    const sigset_t* mask;
    ~MaskRestore() { ::sigprocmask(SIG_SETMASK, mask, nullptr); }
  } restore{&old_mask};
  const pid_t self = ::getpid();

  // Reaps every child that has ended; returns how many.
  auto reap = [&](bool report) {
    int reaped = 0;
    while (!children.empty()) {
      int status = 0;
      const pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid <= 0) break;
      auto it = children.find(pid);
      if (it == children.end()) continue;
      ++reaped;
      const int fd = it->second;
      children.erase(it);
      char buf[64] = {0};
      const ssize_t n = ::read(fd, buf, sizeof buf - 1);
      ::close(fd);
      const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      if (report) {
        if (code == 0 && n > 0) run_ids.push_back(std::atoll(buf));
        if (code != 0) *worst_exit = std::max(*worst_exit, code);
        if (on_done) on_done(labels[pid], code);
      }
      labels.erase(pid);
    }
    return reaped;
  };

  int stop_signal = 0;
  while (next < runs.size() || !children.empty()) {
    while (next < runs.size() && int(children.size()) < jobs) {
      int fds[2];
      if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
      std::fflush(nullptr);
      const pid_t pid = ::fork();
      if (pid < 0) throw std::runtime_error("fork failed");
      if (pid == 0) {
        SetUpChild(self, old_mask);
        ::close(fds[0]);
        int code = RunChild(child, runs[next].second, runs[next].first, command, progress_s,
                            rate_eta, fds[1]);
        std::fflush(nullptr);
        _exit(code);
      }
      ::close(fds[1]);
      children[pid] = fds[0];
      labels[pid] = runs[next].first;
      ++next;
    }
    if (reap(true) > 0) continue;
    siginfo_t info;
    const timespec tick{1, 0};  // a bound, not a poll: SIGCHLD wakes it
    const int sig = ::sigtimedwait(&wait_set, &info, &tick);
    if (sig != SIGCHLD && sig > 0) {
      stop_signal = sig;
      break;
    }
  }
  if (stop_signal == 0) return run_ids;

  // Stopped: stop the children (their runs stay incomplete: complete = 0), wait for them a
  // while, kill the rest, and end with the same signal, as if it had not been caught.
  std::fprintf(stderr, "kvtier %s: %s: stopping %zu run(s); they stay incomplete\n", command,
               strsignal(stop_signal), children.size());
  for (const auto& [pid, fd] : children) ::kill(pid, SIGTERM);
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kChildGraceSeconds);
  while (!children.empty() && std::chrono::steady_clock::now() < deadline) {
    if (reap(false) > 0) continue;
    siginfo_t info;
    const timespec tick{0, 100'000'000};
    ::sigtimedwait(&chld, &info, &tick);
  }
  for (const auto& [pid, fd] : children) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    ::close(fd);
  }
  std::fflush(nullptr);
  std::signal(stop_signal, SIG_DFL);
  ::sigprocmask(SIG_SETMASK, &old_mask, nullptr);
  ::raise(stop_signal);
  _exit(128 + stop_signal);  // if the signal was blocked before kvtier started
}

void PrintComparison(const std::string& out, const std::vector<long long>& run_ids) {
  if (run_ids.empty()) return;
  const std::vector<RunSummaryRow> rows = RunSummaries(out, run_ids);
  std::string ids;
  for (long long id : run_ids) ids += (ids.empty() ? "" : ",") + std::to_string(id);
  std::printf("\n%-12s %8s %10s %10s %10s %10s %10s %7s %7s %12s %8s\n", "system", "requests",
              "mean TTFT", "p50 TTFT", "p99 TTFT", "queue", "exposed IO", "GPU hit", "CPU hit",
              "SSD read/req", "ITF fb");
  auto ms = [](double s) {
    char b[32];
    std::snprintf(b, sizeof b, "%.1fms", s * 1e3);
    return std::string(b);
  };
  auto mib = [](double bytes) {  // one unit for the whole column
    char b[32];
    std::snprintf(b, sizeof b, "%.1fMiB", bytes / (1024.0 * 1024.0));
    return std::string(b);
  };
  auto pct = [](const std::optional<double>& ratio) {
    if (!ratio) return std::string("-");
    char b[32];
    std::snprintf(b, sizeof b, "%.1f%%", 100 * *ratio);
    return std::string(b);
  };
  for (const RunSummaryRow& r : rows) {
    std::printf("%-12s %8lld %10s %10s %10s %10s %10s %7s %7s %12s %8s\n", r.system.c_str(),
                r.requests, ms(r.mean_ttft_s).c_str(), ms(r.p50_ttft_s).c_str(),
                ms(r.p99_ttft_s).c_str(), ms(r.mean_queue_s).c_str(),
                ms(r.mean_io_stall_s).c_str(), pct(r.gpu_hit_ratio).c_str(),
                pct(r.cpu_hit_ratio).c_str(), mib(r.mean_ssd_read_bytes).c_str(),
                pct(r.itf_fallback_rate).c_str());
  }
  // Systems that decode (decode.policy): their decode batch, from the decode_throughput view.
  const std::vector<DecodeSummaryRow> decode = DecodeSummaries(out, run_ids);
  if (!decode.empty()) {
    std::printf("\n%-16s %8s %8s %12s %10s %9s %10s %10s %10s %10s\n", "decode", "requests",
                "tokens", "tokens/s", "mean batch", "max batch", "step", "stall", "mean TPOT",
                "p99 TPOT");
    for (const DecodeSummaryRow& d : decode) {
      std::printf("%-16s %8lld %8lld %12.1f %10.1f %9lld %10s %10s %10s %10s\n",
                  d.system.c_str(), d.requests, d.tokens, d.tokens_per_s, d.mean_batch,
                  d.max_batch, ms(d.mean_step_s).c_str(), ms(d.mean_stall_s).c_str(),
                  ms(d.mean_tpot_s).c_str(), ms(d.p99_tpot_s).c_str());
    }
  }
  std::printf("\nresults: %s (run ids %s; query the run_summary, ttft_cdf, layer_retention, "
              "io_breakdown views%s)\n", out.c_str(), ids.c_str(),
              decode.empty() ? "" : "; decode: tpot_cdf, decode_throughput, decode_steps");
}

int RunSim(const Args& args) {
  ExperimentArgs a({.name = "sim",
                    .about = "Simulates each system on the experiment's trace and hardware "
                             "profile, each in its own\nprocess, into one results file, and prints "
                             "their comparison (the run_summary view).\nEvery system's "
                             "configuration is validated before any simulation starts.",
                    .jobs_help = "systems simulated at once"});
  bool progress = false, quiet = false;
  AddSimProgressFlags(&a, &progress, &quiet);
  if (!a.Parse(args)) return 0;
  const Config base = a.Base();
  const std::vector<std::pair<std::string, Config>> runs = a.Runs();
  const std::string trace = runs.front().second.GetString("workload.trace");
  a.CreateOut();

  if (!quiet) {
    std::fprintf(stderr, "kvtier sim: %zu system(s) on %s, trace %s -> %s\n", runs.size(),
                 base.GetString("model.name").c_str(), trace.c_str(), a.out().c_str());
  }
  int worst = 0;
  const double interval_s = base.GetDuration("log.progress");
  ProgressOptions rate_eta;
  const bool use_rate_eta = SimProgressOptions(interval_s, a.jobs(), progress, quiet, &rate_eta);
  std::vector<long long> ids =
      RunInChildren(runs, a.jobs(), interval_s, "sim", SimChild(a.out()), &worst, nullptr,
                    use_rate_eta ? &rate_eta : nullptr);
  PrintComparison(a.out(), ids);
  return worst;
}

}  // namespace kvtier::cli
