// libFuzzer target: the INI/config loader with includes (core/config.h) and option validation
// (core/options.h). The input is up to four files separated by a line "----": the experiment
// (configs/experiments/e.ini), then the model (models/m.ini), hardware (hardware/h.ini) and
// system (systems/s.ini) files its [include] section may name as m, h and s.

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>

#include "core/config.h"
#include "core/errors.h"
#include "core/options.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

const std::string& ConfigRoot() {
  static const std::string root = [] {
    const std::string r = kvtier::fuzz::ScratchDir() + "/configs";
    for (const char* d : {"experiments", "models", "hardware", "systems"}) {
      std::filesystem::create_directories(r + "/" + d);
    }
    setenv("KVTIER_CONFIG_DIR", r.c_str(), 1);
    return r;
  }();
  return root;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& root = ConfigRoot();
  static const char* const kFiles[] = {"experiments/e.ini", "models/m.ini", "hardware/h.ini",
                                       "systems/s.ini"};
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  for (const char* name : kFiles) {
    const std::size_t sep = rest.find("\n----\n");
    const std::string_view part = rest.substr(0, sep);
    kvtier::fuzz::WriteScratch(std::string("configs/") + name,
                               reinterpret_cast<const uint8_t*>(part.data()), part.size());
    rest = sep == std::string_view::npos ? std::string_view() : rest.substr(sep + 6);
  }
  try {
    const kvtier::Config c = kvtier::Config::Load(root + "/" + kFiles[0], {});
    kvtier::BuildOptions(c);
    (void)c.Dump();
  } catch (const kvtier::InputError&) {
  }
  return 0;
}
