#pragma once
// The setup the hw CLI tests share (tests that drive the built `kvtier` binary, whose path
// tests/hw/executor.cmake passes as KVTIER_CLI): a tiny smollm2-135m-shaped trace, two prompts
// of one or two ~200-token examples, small enough that `kvtier hw` on the host backend runs it
// in seconds.

#include <string>

#include "tests/testutil/run_command.h"

namespace kvtier::hw::testing {

// Writes `requests` requests to <dir>/t.trace with `kvtier trace gen` (`extra`: more flags,
// e.g. decode lengths); returns its exit status and appends what it printed to *out.
inline int GenTinySmollmTrace(const std::string& kvtier, const std::string& dir, int requests,
                              std::string* out, const std::string& extra = "") {
  return kvtier::testing::RunCmd(
      kvtier + " trace gen --quiet --out " + dir + "/t.trace --requests " +
          std::to_string(requests) +
          " --prompts 2 --tasks 1 --examples_min 1 --examples_max 2 --example_tokens 200 "
          "--example_tokens_sd 20 --rate 50 --model-name smollm2-135m --model-layers 30 "
          "--model-heads 9 --model-kv-heads 3 --vocab 49152 --calibration_tokens 256" +
          (extra.empty() ? "" : " " + extra),
      out);
}

}  // namespace kvtier::hw::testing
