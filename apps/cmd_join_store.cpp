// `rlserve join-store`: the rendezvous half of joining a trainer's NCCL weight-update group, alone
// — connect to the TCPStore the trainer's rank 0 hosts, count in as one engine rank ("init/" + 1),
// and print the NCCL unique id of the group's first communicator once the trainer has created it.
// For checking, before a run, that an engine host reaches the trainer's store and that the
// group name and key layout agree (it counts as a rank: run it against a test group). The tests
// drive the client through it (tests/python/test_tcp_store.py, tests/gpu/test_tcp_store.py).
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "apps/command.hpp"
#include "messages/base64.hpp"
#include "model/tcp_store.hpp"

namespace rlserve::apps {

namespace {

struct join_store_options {
  std::string master_address = "127.0.0.1";
  int master_port = 0;
  std::string group_name = "weight_update_group";
  double timeout_s = 60.0;
};

void run_join_store(const join_store_options& o) {
  if (!(o.timeout_s > 0.0) || o.timeout_s > 86400.0)
    throw command_failed("--timeout: expected seconds in (0, 86400]");
  const auto deadline = model::tcp_store_client::clock::now() +
                        std::chrono::duration_cast<model::tcp_store_client::clock::duration>(
                          std::chrono::duration<double>(o.timeout_s));
  auto joined = model::join_trainer_store(o.master_address, o.master_port, o.group_name, deadline);
  if (!joined)
    throw command_failed(joined.error());
  nlohmann::json out{{"key", model::nccl_unique_id_key(o.group_name)},
                     {"nccl_unique_id", hex_encode(joined->nccl_unique_id)},
                     {"joined", joined->joined}};
  std::printf("%s\n", out.dump().c_str());
}

void add_join_store(CLI::App& app) {
  auto options = std::make_shared<join_store_options>();
  auto* cmd = app.add_subcommand(
    "join-store", "Join a trainer's TCPStore as one engine rank and print its weight-update "
                  "group's NCCL unique id (checks the rendezvous before a run)");
  cmd->add_option("--master-address", options->master_address, "The trainer's rank 0 host")
    ->capture_default_str();
  cmd->add_option("--master-port", options->master_port, "Its store's port")->required();
  cmd->add_option("--group-name", options->group_name, "The group, as the trainer names it")
    ->capture_default_str();
  cmd->add_option("--timeout", options->timeout_s, "Seconds to wait for the store and the id")
    ->capture_default_str();
  cmd->callback([options] { run_join_store(*options); });
}

const command_registrar registrar{93, add_join_store};

} // namespace

} // namespace rlserve::apps
