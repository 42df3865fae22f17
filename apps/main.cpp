// rlserve — the command line. See README.md for the commands; `rlserve --help` lists them.
#include <algorithm>
#include <cstdio>

#include "apps/command.hpp"

namespace rlserve::apps {

std::vector<command_registration>& registered_commands() {
  static std::vector<command_registration> commands;
  return commands;
}

} // namespace rlserve::apps

int main(int argc, char** argv) {
  using namespace rlserve::apps;
  CLI::App app{"rlserve: a rollout engine for reinforcement learning of LLMs (INT4 MoE serving "
               "with verifiable weight updates)"};
  app.require_subcommand(1);
  auto commands = registered_commands();
  std::sort(commands.begin(), commands.end(),
            [](const auto& a, const auto& b) { return a.order < b.order; });
  for (const auto& c : commands)
    c.add(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const command_failed& e) {
    std::fprintf(stderr, "rlserve %s: %s\n", app.get_subcommands().empty()
                   ? "" : app.get_subcommands().front()->get_name().c_str(), e.what());
    return 1;
  }
  return 0;
}
