// `rlserve inspect-ipc`: what rlserve reads from one PyTorch CUDA IPC pickle (the bytes of one
// serialized_named_tensors element, raw or base64), as the device_tensors JSON the engine would
// get; without a file, the opcodes and globals the reader accepts. The Python reference test
// disassembles the same files with pickletools and compares.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "apps/command.hpp"
#include "messages/base64.hpp"
#include "messages/json_codec.hpp"
#include "messages/torch_pickle.hpp"

namespace rlserve::apps {

namespace {

struct inspect_ipc_options {
  std::string file;
  std::string load_format;
  bool base64 = false;
};

void run_inspect_ipc(const inspect_ipc_options& o) {
  nlohmann::json out;
  if (o.file.empty()) {
    out["opcodes"] = nlohmann::json::array();
    for (auto name : torch_pickle_opcodes())
      out["opcodes"].push_back(name);
    out["globals"] = torch_pickle_globals();
    std::printf("%s\n", out.dump().c_str());
    return;
  }
  std::ifstream in(o.file, std::ios::binary);
  if (!in)
    throw command_failed(o.file + ": cannot open");
  std::string text((std::istreambuf_iterator<char>(in)), {});
  std::vector<std::byte> bytes;
  if (o.base64) {
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r'))
      text.pop_back();
    auto decoded = base64_decode(text);
    if (!decoded)
      throw command_failed(o.file + ": " + decoded.error());
    bytes = std::move(*decoded);
  } else {
    bytes.resize(text.size());
    std::memcpy(bytes.data(), text.data(), text.size());
  }
  torch_pickle_form form = torch_pickle_form::named_list;
  if (o.load_format == "flattened_bucket")
    form = torch_pickle_form::flattened_bucket;
  else if (!o.load_format.empty() && o.load_format != "direct")
    throw command_failed("--load-format: expected direct or flattened_bucket, got " +
                         o.load_format);
  auto tensors = read_torch_ipc_pickle(bytes, form);
  if (!tensors)
    throw command_failed(o.file + ": " + tensors.error());
  out["device_tensors"] = nlohmann::json::array();
  for (const auto& t : *tensors)
    out["device_tensors"].push_back(to_json(t));
  std::printf("%s\n", out.dump().c_str());
}

void add_inspect_ipc(CLI::App& app) {
  auto options = std::make_shared<inspect_ipc_options>();
  auto* cmd = app.add_subcommand(
    "inspect-ipc", "Read a PyTorch CUDA IPC pickle (one serialized_named_tensors element) and "
                   "print its tensors as device_tensors JSON; without FILE, list what the reader "
                   "accepts");
  cmd->add_option("file", options->file, "The pickle (raw bytes, or base64 with --base64)");
  cmd->add_option("--load-format", options->load_format,
                  "direct (a list of (name, tensor); the default) or flattened_bucket");
  cmd->add_flag("--base64", options->base64, "FILE holds base64 text, as the JSON carries it");
  cmd->callback([options] { run_inspect_ipc(*options); });
}

const command_registrar registrar{92, add_inspect_ipc};

} // namespace

} // namespace rlserve::apps
