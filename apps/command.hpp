// The `rlserve` command line is one CLI11 app with a subcommand per apps/cmd_*.cpp file. Each
// file registers itself with a static `command_registrar`, so adding a command never touches
// main.cpp. A command reports failure by throwing command_failed (printed as "rlserve <cmd>:
// <message>", exit code 1); nothing else escapes to main.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace rlserve::apps {

using add_command_fn = void (*)(CLI::App& app);

struct command_registration {
  int order; // position in --help (lower first)
  add_command_fn add;
};

std::vector<command_registration>& registered_commands();

struct command_registrar {
  command_registrar(int order, add_command_fn add) { registered_commands().push_back({order, add}); }
};

struct command_failed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// `--quantize RECIPE --group-size G` of the commands that start an engine (generate, demo,
// serve): quantize the BF16 model to INT4 at load (engine_config::quantize). Checked when the
// engine starts, with the same messages everywhere.
inline void add_quantize_options(CLI::App& cmd, std::string& recipe, int32_t& group_size) {
  cmd.add_option("--quantize", recipe,
                 "Quantize the BF16 model's routed experts to INT4 at load: int4-asym, int4-sym-qat or "
                 "int4-sym (as `rlserve quantize` would)");
  cmd.add_option("--group-size", group_size, "With --quantize: 32, 64, 128, or -1 (per channel)")
    ->capture_default_str();
}

} // namespace rlserve::apps
