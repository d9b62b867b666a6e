#pragma once
// The chunk store directory of one `kvtier hw` run, and the cleanup of the ones killed runs
// left behind.
//
// By default a run stores its chunks in `<out>.store-<system>/` (a preallocated data file of
// hw.store_capacity, 512 MiB and more) and removes it when the run ends, however it ends: normally,
// on an error, or when SIGTERM/SIGINT/SIGHUP stops the run between requests (cli/cmd_hw.cc). Only
// SIGKILL (or a power loss) can leave one behind. Such a store carries an owner file naming the
// process (pid and start time) that made it, so the next `kvtier hw` writing the same results
// file recognises it as stale — its owner no longer runs — and removes it.
//
// A directory the user names with hw.store_dir is the user's: it is checked and used, never
// removed, and carries no owner file.
//
// Not thread-safe; one RunStoreDir per run.

#include <string>
#include <vector>

namespace kvtier::hw {

class RunStoreDir {
 public:
  // Makes `dir` usable as a chunk store directory: creates it (and its parents) if absent and
  // checks that a file can be created in it. `where` names the setting in errors ("exp.ini:9:
  // hw.store_dir"). Throws ConfigError (exit 2) when `dir` is an existing non-directory, cannot
  // be created, or is not writable (e.g. under /proc). When `owned` (the default store), an old
  // directory of that name is removed first and an owner file marks the new one; the
  // destructor removes the directory.
  RunStoreDir(const std::string& dir, bool owned, const std::string& where);
  ~RunStoreDir();
  RunStoreDir(const RunStoreDir&) = delete;
  RunStoreDir& operator=(const RunStoreDir&) = delete;

  const std::string& path() const { return dir_; }

 private:
  std::string dir_;
  bool owned_;
};

// The name of the owner file in an owned store directory.
inline constexpr const char* kStoreOwnerFile = "kvtier-owner";

// Removes every `<out_path>.store-*` directory whose owner file names a process that no longer
// runs (same boot, same pid and start time, or else stale), and returns the paths removed.
// Directories without an owner file (kept stores, user stores) are never touched.
std::vector<std::string> RemoveStaleStores(const std::string& out_path);

}  // namespace kvtier::hw
