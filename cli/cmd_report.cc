// kvtier report: the papers' figures and a browsable page from a results database.
//
//   kvtier report R.sqlite --out DIR [--runs 1,3-5] [--quiet]
//
// The figures are drawn by analysis/report.py with matplotlib (FIGURES there lists every figure
// as a query and a plot kind). This command checks its input, finds the script and a Python
// that can import matplotlib, runs it and returns its exit code: 0 written, 2 bad input (a
// missing or non-SQLite database, --out not writable, unknown run ids, matplotlib missing).
//
// The script is looked for, in order, at $KVTIER_REPORT_SCRIPT, beside the binary (the build
// copies it there, with views.sql), at <prefix>/share/kvtier/report.py for an installed
// binary, and in the source tree the binary was built from. Python is $KVTIER_PYTHON, else the
// first of `python3` on PATH and /usr/bin/python3 that imports matplotlib (Debian's
// python3-matplotlib lives in /usr/bin/python3's dist-packages; a pyenv or venv python3 earlier
// on PATH may lack it).


#include <boost/program_options.hpp>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cli/command_line.h"
#include "cli/commands.h"
#include "cli/subprocess.h"
#include "core/errors.h"
#include "core/input_file.h"

namespace kvtier::cli {
namespace {

namespace po = boost::program_options;
namespace fs = std::filesystem;

fs::path ExeDir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path() : exe.parent_path();
}

fs::path FindScript() {
  std::vector<fs::path> candidates;
  if (const char* env = std::getenv("KVTIER_REPORT_SCRIPT"); env != nullptr && *env) {
    if (!fs::is_regular_file(env)) {
      throw InputError(std::string("KVTIER_REPORT_SCRIPT=") + env + ": no such file");
    }
    return env;
  }
  const fs::path exe_dir = ExeDir();
  if (!exe_dir.empty()) {
    candidates.push_back(exe_dir / "report.py");
    candidates.push_back(exe_dir.parent_path() / "share" / "kvtier" / "report.py");
  }
  candidates.push_back(fs::path(KVTIER_REPO_DIR) / "analysis" / "report.py");
  std::string looked;
  for (const fs::path& p : candidates) {
    std::error_code ec;
    if (fs::is_regular_file(p, ec)) return p;
    looked += (looked.empty() ? "" : ", ") + p.string();
  }
  throw InputError("the report script analysis/report.py was not found (looked at " + looked +
                   "; set KVTIER_REPORT_SCRIPT to its path)");
}

// The Python that runs the script: one that imports matplotlib.
std::string FindPython() {
  if (const char* env = std::getenv("KVTIER_PYTHON"); env != nullptr && *env) {
    const int code = Spawn({env, "-c", "import matplotlib"}, true);
    if (code == 0) return env;
    if (code == 127 || code == -1) {
      throw InputError(std::string("KVTIER_PYTHON=") + env + ": cannot run it");
    }
    throw InputError(std::string("matplotlib is missing for KVTIER_PYTHON=") + env +
                     ": install it (Debian: sudo apt-get install python3-matplotlib, for "
                     "/usr/bin/python3) or point KVTIER_PYTHON at a Python that has it");
  }
  std::vector<std::string> tried;
  for (const std::string py : {"python3", "/usr/bin/python3"}) {
    const int code = Spawn({py, "-c", "import matplotlib"}, true);
    if (code == 0) return py;
    if (code != 127 && code != -1) tried.push_back(py);
  }
  if (tried.empty()) {
    throw InputError("python3 not found: install it with matplotlib (Debian: sudo apt-get "
                     "install python3 python3-matplotlib; scripts/setup.sh does)");
  }
  std::string names;
  for (const std::string& t : tried) names += (names.empty() ? "" : " and ") + t;
  throw InputError("matplotlib is missing (tried " + names + "): install it with "
                   "`sudo apt-get install python3-matplotlib` (scripts/setup.sh does), or set "
                   "KVTIER_PYTHON to a Python that has it");
}

void CheckDatabase(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw InputError(path + ": no such file");
  if (fs::is_directory(path, ec)) throw InputError(path + ": is a directory, not a results database");
  // A FIFO or a device would block the read below (`report FIFO` hung, found probing).
  RequireRegularFile(path, "a results database");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot read: " + std::strerror(errno));
  char head[16] = {};
  in.read(head, sizeof head);
  if (in.gcount() != 16 || std::memcmp(head, "SQLite format 3", 16) != 0) {
    throw InputError(path + ": not an SQLite database (a kvtier results file is written by "
                     "kvtier sim, hw, sweep, validate or eval --out)");
  }
}

void CheckOutDir(const std::string& out) {
  std::error_code ec;
  if (fs::exists(out, ec) && !fs::is_directory(out, ec)) {
    throw InputError("--out " + out + ": not a directory");
  }
  fs::create_directories(out, ec);
  if (ec) throw InputError("--out " + out + ": cannot create the directory: " + ec.message());
  if (!fs::is_directory(out, ec)) throw InputError("--out " + out + ": not a directory");
  const fs::path probe = fs::path(out) / ".kvtier-report-write-test";
  {
    std::ofstream f(probe);
    if (!f) throw InputError("--out " + out + ": not writable: " + std::strerror(errno));
  }
  fs::remove(probe, ec);
}

}  // namespace

int RunReport(const Args& args) {
  std::string db, out, runs;
  bool quiet = false;
  po::options_description desc("kvtier report options");
  desc.add_options()("help,h", "show this help")(
      "database", po::value(&db), "results SQLite file (positional)")(
      "out", po::value(&out), "directory for the figures and index.html (created if absent)")(
      "runs", po::value(&runs), "run ids to report, e.g. 1,3-5 (default: every run)")(
      "quiet", po::bool_switch(&quiet), "print only errors");
  po::positional_options_description pos;
  pos.add("database", 1);
  po::variables_map vm;
  StoreArgs("report", args, desc, desc, &vm, &pos);  // no option-name guessing
  NotifyArgs("report", &vm);
  if (vm.count("help")) {
    std::ostringstream s;
    s << desc;
    std::printf("usage: kvtier report R.sqlite --out DIR [--runs 1,3-5] [--quiet]\n\n"
                "Figures (PNG, SVG, the CSV of the plotted data, the SQL) and DIR/index.html\n"
                "from the complete runs of a results database.\n\n%s", s.str().c_str());
    return 0;
  }
  if (db.empty()) throw InputError("command line: no database given (kvtier report R.sqlite --out DIR)");
  if (out.empty()) throw InputError("command line: --out DIR is required");
  CheckDatabase(db);
  CheckOutDir(out);
  const fs::path script = FindScript();
  const std::string python = FindPython();
  std::vector<std::string> argv = {python, script.string(), db, "--out", out};
  if (!runs.empty()) argv.insert(argv.end(), {"--runs", runs});
  if (quiet) argv.push_back("--quiet");
  const int code = Spawn(argv, false);
  if (code == -1 || code == 127) {
    std::fprintf(stderr, "kvtier report: could not run %s %s\n", python.c_str(),
                 script.c_str());
    return 1;
  }
  return code;
}

}  // namespace kvtier::cli
