// The `rlserve` command line is one CLI11 app with a subcommand per apps/cmd_*.cpp file. Each
// file registers itself with a static `command_registrar`, so adding a command never touches
// main.cpp. A command reports failure by throwing command_failed (printed as "rlserve <cmd>:
// <message>", exit code 1); nothing else escapes to main.
#pragma once

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

} // namespace rlserve::apps
