#include "hw/store_dir.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/errors.h"

namespace kvtier::hw {
namespace {

namespace fs = std::filesystem;

std::string ReadSmall(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string BootId() {
  std::string id = ReadSmall("/proc/sys/kernel/random/boot_id");
  while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
  return id;
}

// Field 22 of /proc/<pid>/stat: the process's start time in clock ticks since boot; with the
// pid it names one process (a pid alone may be reused). "" when the process does not exist or
// has ended (a zombie not yet reaped: state Z or X in field 3).
std::string StartTime(long pid) {
  const std::string stat = ReadSmall("/proc/" + std::to_string(pid) + "/stat");
  const auto paren = stat.rfind(')');  // the command name may contain spaces and parentheses
  if (paren == std::string::npos) return "";
  std::istringstream in(stat.substr(paren + 1));
  std::string field;
  for (int i = 3; i <= 22 && (in >> field); ++i) {
    if (i == 3 && (field == "Z" || field == "X")) return "";
    if (i == 22) return field;
  }
  return "";
}

std::string OwnerText() {
  const long pid = long(::getpid());
  return "kvtier hw chunk store; removed when its run ends\npid " + std::to_string(pid) +
         "\nstart " + StartTime(pid) + "\nboot " + BootId() + "\n";
}

// True when the owner file at `path` names a process that is still running.
bool OwnerAlive(const std::string& path) {
  std::istringstream in(ReadSmall(path));
  std::string line, key, start, boot;
  long pid = -1;
  while (std::getline(in, line)) {
    std::istringstream l(line);
    l >> key;
    if (key == "pid") l >> pid;
    if (key == "start") l >> start;
    if (key == "boot") l >> boot;
  }
  if (pid <= 0 || boot != BootId()) return false;
  return !start.empty() && StartTime(pid) == start;
}

}  // namespace

RunStoreDir::RunStoreDir(const std::string& dir, bool owned, const std::string& where)
    : dir_(dir), owned_(false) {
  std::error_code ec;
  if (owned) {
    const std::string owner = dir + "/" + kStoreOwnerFile;
    if (fs::exists(owner, ec) && OwnerAlive(owner)) {
      throw ConfigError(where + ": " + dir + " is the chunk store of a run still in progress (" +
                        owner + "); write to another --out file");
    }
    fs::remove_all(dir, ec);  // an old store of this run's name (a killed run's)
  }
  const fs::file_status st = fs::status(dir, ec);
  if (fs::exists(st) && !fs::is_directory(st)) {
    throw ConfigError(where + ": " + dir + " exists and is not a directory");
  }
  fs::create_directories(dir, ec);
  if (ec) throw ConfigError(where + ": cannot create directory " + dir + ": " + ec.message());
  // Creating the store's files is the first write; try one now, so an unwritable place (a
  // read-only mount, /proc, another user's directory) is a clear error before the run starts.
  const std::string probe = dir + "/.kvtier-probe-" + std::to_string(::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    throw ConfigError(where + ": cannot create files in " + dir + ": " + std::strerror(errno));
  }
  ::close(fd);
  ::unlink(probe.c_str());
  if (owned) {
    std::ofstream(dir + "/" + kStoreOwnerFile) << OwnerText();
    owned_ = true;
  }
}

RunStoreDir::~RunStoreDir() {
  if (!owned_) return;
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

std::vector<std::string> RemoveStaleStores(const std::string& out_path) {
  std::vector<std::string> removed;
  std::error_code ec;
  const fs::path out(out_path);
  const fs::path parent = out.parent_path().empty() ? fs::path(".") : out.parent_path();
  const std::string prefix = out.filename().string() + ".store-";
  for (fs::directory_iterator it(parent, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(prefix, 0) != 0 || !it->is_directory(ec)) continue;
    const std::string owner = (it->path() / kStoreOwnerFile).string();
    if (!fs::exists(owner, ec) || OwnerAlive(owner)) continue;
    std::error_code rm;
    fs::remove_all(it->path(), rm);
    if (!rm) removed.push_back(it->path().string());
  }
  return removed;
}

}  // namespace kvtier::hw
