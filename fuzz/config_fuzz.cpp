// model/config.hpp's config.json reader on untrusted files (a checkpoint directory from a
// trainer): load_model_config, and for a config it accepts, to_json -> parse_model_config must
// accept what make-model would write.
#include <cstddef>
#include <cstdint>

#include <nlohmann/json.hpp>

#include "fuzz/fuzz_support.hpp"
#include "model/config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  auto path = rlserve_fuzz::write_scratch_file("config.json", data, size);
  auto config = rlserve::model::load_model_config(path);
  if (!config)
    return 0;
  auto again = rlserve::model::parse_model_config(rlserve::model::to_json(*config), "rewritten");
  if (!again)
    rlserve_fuzz::broken("a config that loaded does not load again after to_json: " +
                         again.error());
  return 0;
}
