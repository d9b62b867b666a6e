#pragma once
// Running another program from a kvtier command: `kvtier report` runs Python, `calibrate
// --driver` runs `kvtier hw`, `sweep --slurm` runs sbatch/squeue. One place for fork, exec and
// the wait, so every caller gets the same exit-code convention and EINTR handling.
//
// Exit codes: the program's own, 128 + N if signal N killed it, 127 if it could not be
// executed (not found, not executable: the shell's convention), -1 if no process was started.

#include <string>
#include <vector>

namespace kvtier::cli {

// Runs argv[0] (looked up on PATH when it has no '/') with argv and waits for it. Its stdout
// and stderr are this process's, or /dev/null when `silent`.
int Spawn(const std::vector<std::string>& argv, bool silent);

// As Spawn, with the program's stdout and stderr (interleaved) appended to *output.
int Capture(const std::vector<std::string>& argv, std::string* output);

// The running binary (/proc/self/exe); throws InputError naming `what` when it cannot be read.
std::string SelfPath(const std::string& what);

}  // namespace kvtier::cli
