// Weight-update messages: SGLang's RL weight-update io_structs (docs/sglang-contract.md, 'Weight
// updates'; the miles branch's begin/end sessions) by field name and default, plus rlserve's
// additions, each marked "(rlserve)". Every *ReqOutput carries success + message.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "caf/meta/type_name.hpp"
#include "messages/dtype.hpp"
#include "messages/enums.hpp"
#include "messages/std_optional_inspect.hpp"
#include "messages/tensor.hpp"

namespace rlserve {

// Which model runners an operation reaches: the target model, the speculative draft, or both.
// JSON: "target" | "draft" | "all".
enum class runner_selector : uint8_t { all = 1, target, draft };

// ---- NCCL weight-update group ------------------------------------------------------------------

// Joins the trainer's NCCL group as rank rank_offset + tp_rank. The rendezvous is either the
// trainer's ncclUniqueId (hex, 256 characters) or a TCP store at master_address:master_port.
struct InitWeightsUpdateGroupReqInput {
  std::string master_address;
  int32_t master_port = 0;
  int32_t rank_offset = 0; // required
  int32_t world_size = 0;  // required: 1 (trainer) + every engine GPU in the group
  std::string group_name = "weight_update_group";
  std::string backend = "nccl";
  std::string nccl_unique_id; // (rlserve) hex of the trainer's ncclUniqueId
  double timeout_s = 600.0;   // (rlserve) deadline for the rendezvous and every collective
};

struct InitWeightsUpdateGroupReqOutput {
  bool success = true;
  std::string message;
};

struct DestroyWeightsUpdateGroupReqInput {
  std::string group_name = "weight_update_group";
};

struct DestroyWeightsUpdateGroupReqOutput {
  bool success = true;
  std::string message;
};

// ---- transports ---------------------------------------------------------------------------------

// One bucket broadcast by the trainer from rank 0 over group `group_name`, in `names` order.
struct UpdateWeightsFromDistributedReqInput {
  std::vector<std::string> names;
  std::vector<dtype> dtypes;               // JSON: PyTorch names ("bfloat16", "int32", ...)
  std::vector<std::vector<int64_t>> shapes;
  std::string group_name = "weight_update_group";
  bool flush_cache = true;
  bool abort_all_requests = false;
  std::optional<std::string> weight_version;
  std::optional<std::string> load_format; // none: one broadcast per tensor; "flattened_bucket"
  runner_selector selector = runner_selector::all;
  bool torch_empty_cache = false;
  // (rlserve) deadline of the receive, the communicator's creation included; none: the group's
  // timeout_s from init_weights_update_group.
  std::optional<double> timeout_s;
  // (internal) who sent it: 0 for HTTP and in-process callers, else the websocket connection.
  // Set by the server, never read from JSON: a session begun on a connection takes its updates
  // and its end from that connection only.
  uint64_t requester = 0;
  // (internal) the weight_updater's ticket for the bytes it already received for this update
  // (the scheduler has the broadcast received outside its one-at-a-time weight operations, so
  // generation runs meanwhile, then sends the update with its ticket). 0: not yet received.
  uint64_t received = 0;
};

struct UpdateWeightsFromDistributedReqOutput {
  bool success = true;
  std::string message;
};

// A named device tensor: a CUDA IPC handle from a colocated trainer (or a pointer in-process).
struct NamedDeviceTensor {
  std::string name;
  DeviceTensorRef tensor;
};

// Tensors inline (host bytes: zero-copy in-process, binary frames over the websocket) or as
// CUDA IPC handles. SGLang's serialized_named_tensors (PyTorch IPC pickles, one per engine GPU)
// has no field here: the JSON codec reads it into device_tensors, a flattened bucket already
// split into its tensors.
struct UpdateWeightsFromTensorReqInput {
  std::vector<NamedTensor> named_tensors;
  std::vector<NamedDeviceTensor> device_tensors; // (rlserve) CUDA IPC transport
  // none | "direct" | "flattened_bucket". For serialized_named_tensors it says how the pickle
  // was laid out; device_tensors hold one tensor per name either way.
  std::optional<std::string> load_format;
  bool flush_cache = true;
  bool abort_all_requests = false;
  std::optional<std::string> weight_version;
  runner_selector selector = runner_selector::all;
  bool torch_empty_cache = false;
  // (internal) who sent it: 0 for HTTP and in-process callers, else the websocket connection.
  // Set by the server, never read from JSON: a session begun on a connection takes its updates
  // and its end from that connection only.
  uint64_t requester = 0;
};

struct UpdateWeightsFromTensorReqOutput {
  bool success = true;
  std::string message;
};

// A safetensors checkpoint directory (HF layout). Legacy shape: no session needed; it is a
// session of its own (begin, load everything, end) and fails if another session is open.
struct UpdateWeightFromDiskReqInput {
  std::string model_path; // required
  std::optional<std::string> load_format;
  bool abort_all_requests = false;
  std::optional<std::string> weight_version;
  bool is_async = false;
  bool torch_empty_cache = false;
  bool keep_pause = false;
  bool recapture_cuda_graph = false;
  int32_t token_step = 0;
  bool flush_cache = true;
  runner_selector selector = runner_selector::all; // (rlserve)
};

struct UpdateWeightFromDiskReqOutput {
  bool success = true;
  std::string message;
  int32_t num_paused_requests = 0;
};

// ---- the session --------------------------------------------------------------------------------

// Opens a session: records the selector (end reuses it) and restores the selected runners'
// quantized modules to the load format.
struct BeginWeightUpdateReqInput {
  runner_selector selector = runner_selector::all;
  // (internal) who sent it: 0 for HTTP and in-process callers, else the websocket connection.
  // Set by the server, never read from JSON: a session begun on a connection takes its updates
  // and its end from that connection only.
  uint64_t requester = 0;
};

struct BeginWeightUpdateReqOutput {
  bool success = true;
  std::string message;
};

// Closes the session: commit (post-process, swap in, set the version) or abort (drop what was
// staged; the old weights keep serving).
struct EndWeightUpdateReqInput {
  std::optional<std::string> weight_version; // (rlserve) the label the committed weights get
  bool abort = false;                        // (rlserve)
  // (internal) who sent it: 0 for HTTP and in-process callers, else the websocket connection.
  // Set by the server, never read from JSON: a session begun on a connection takes its updates
  // and its end from that connection only.
  uint64_t requester = 0;
};

struct EndWeightUpdateReqOutput {
  bool success = true;
  std::string message;
  std::string weight_version; // (rlserve) the version serving after this call
  bool session_open = false;  // (rlserve) whether a session is still open after this call (a
                              // refused end leaves it open, a failed commit closes it)
};

// Generation 1 of the miles API, kept for clients that still send it. Inside a session it is
// refused (the session does both steps); outside one it runs the requested steps.
struct PostProcessWeightsReqInput {
  bool restore_weights_before_loading = false; // JSON also accepts restore_weights_before_load
  bool post_process_quantization = false;
  runner_selector selector = runner_selector::all;
};

struct PostProcessWeightsReqOutput {
  bool success = true;
  std::string message;
};

struct UpdateWeightVersionReqInput {
  std::string new_version; // required
  // SGLang defaults this to true, which silently killed requests that retract/in_place pausing
  // had kept (miles #2589); rlserve defaults to false: a label never aborts anything by itself.
  bool abort_all_requests = false;
};

struct UpdateWeightVersionReqOutput {
  bool success = true;
  std::string message;
  std::string new_version;
};

// ---- verification -------------------------------------------------------------------------------

enum class check_weights_action : uint8_t { checksum = 1, snapshot, compare, reset_tensors };

struct CheckWeightsReqInput {
  check_weights_action action = check_weights_action::checksum;
  bool allow_quant_error = false;
  std::vector<std::string> skip_tensor_list; // name substrings left out of every action
  runner_selector selector = runner_selector::all;
};

struct ParallelismInfo {
  int32_t tp_rank = 0, tp_size = 1, dp_rank = 0, dp_size = 1, pp_rank = 0, pp_size = 1;
  int32_t rank = 0, size = 1;
  std::string role = "target";
};

// One rank's checksums. `checksums`: tensor name -> XXH3-64 (16 lowercase hex digits) of the
// tensor's canonical load-format bytes; draft tensors are keyed "draft.<name>". `role_checksums`:
// role -> XXH3-64 over the role's sorted (name, digest) pairs (docs/formats.md gives the exact
// byte stream, so a trainer can recompute it with the Python xxhash package).
struct ChecksumInfo {
  std::map<std::string, std::string> checksums;
  std::map<std::string, std::string> role_checksums;
  std::string per_gpu_checksum; // over every key of `checksums`, the same way
  std::vector<ParallelismInfo> parallelism_info; // one per role
};

struct CheckWeightsReqOutput {
  bool success = true;
  std::string message;
  // checksum: one per GPU (rlserve runs one). JSON and HTTP: "ranks", SGLang's HTTP name.
  std::vector<ChecksumInfo> payload;
  // checksum: XXH3-64 over the ranks' per_gpu_checksum texts in rank order (SGLang: SHA-256).
  std::string per_engine_checksum;
  std::vector<std::string> changed;   // compare: tensors that differ from the snapshot
  std::vector<std::string> unchanged; // compare: tensors equal to the snapshot
};

struct GetWeightsByNameReqInput {
  std::string name; // required
  int32_t truncate_size = 100;
  runner_selector selector = runner_selector::target; // (rlserve) which runner to read
};

struct GetWeightsByNameReqOutput {
  bool success = true;
  std::string message;
  std::vector<float> parameter; // the first truncate_size values, as float
  dtype type = dtype::f32;      // (rlserve) the tensor's load-format dtype
  std::vector<int64_t> shape;   // (rlserve)
};

// ---- inspect (CAF 0.17 form) ------------------------------------------------------------------

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, InitWeightsUpdateGroupReqInput& x) {
  return f(caf::meta::type_name("InitWeightsUpdateGroupReqInput"), x.master_address,
           x.master_port, x.rank_offset, x.world_size, x.group_name, x.backend, x.nccl_unique_id,
           x.timeout_s);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, InitWeightsUpdateGroupReqOutput& x) {
  return f(caf::meta::type_name("InitWeightsUpdateGroupReqOutput"), x.success, x.message);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, DestroyWeightsUpdateGroupReqInput& x) {
  return f(caf::meta::type_name("DestroyWeightsUpdateGroupReqInput"), x.group_name);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, DestroyWeightsUpdateGroupReqOutput& x) {
  return f(caf::meta::type_name("DestroyWeightsUpdateGroupReqOutput"), x.success, x.message);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, UpdateWeightsFromDistributedReqInput& x) {
  return f(caf::meta::type_name("UpdateWeightsFromDistributedReqInput"), x.names, x.dtypes,
           x.shapes, x.group_name, x.flush_cache, x.abort_all_requests, x.weight_version,
           x.load_format, x.selector, x.torch_empty_cache, x.timeout_s, x.requester, x.received);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, UpdateWeightsFromDistributedReqOutput& x) {
  return f(caf::meta::type_name("UpdateWeightsFromDistributedReqOutput"), x.success, x.message);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, NamedDeviceTensor& x) {
  return f(caf::meta::type_name("NamedDeviceTensor"), x.name, x.tensor);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, UpdateWeightsFromTensorReqInput& x) {
  return f(caf::meta::type_name("UpdateWeightsFromTensorReqInput"), x.named_tensors,
           x.device_tensors, x.load_format, x.flush_cache, x.abort_all_requests,
           x.weight_version, x.selector, x.torch_empty_cache, x.requester);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, UpdateWeightsFromTensorReqOutput& x) {
  return f(caf::meta::type_name("UpdateWeightsFromTensorReqOutput"), x.success, x.message);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, UpdateWeightFromDiskReqInput& x) {
  return f(caf::meta::type_name("UpdateWeightFromDiskReqInput"), x.model_path, x.load_format,
           x.abort_all_requests, x.weight_version, x.is_async, x.torch_empty_cache, x.keep_pause,
           x.recapture_cuda_graph, x.token_step, x.flush_cache, x.selector);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, UpdateWeightFromDiskReqOutput& x) {
  return f(caf::meta::type_name("UpdateWeightFromDiskReqOutput"), x.success, x.message,
           x.num_paused_requests);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, BeginWeightUpdateReqInput& x) {
  return f(caf::meta::type_name("BeginWeightUpdateReqInput"), x.selector, x.requester);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, BeginWeightUpdateReqOutput& x) {
  return f(caf::meta::type_name("BeginWeightUpdateReqOutput"), x.success, x.message);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, EndWeightUpdateReqInput& x) {
  return f(caf::meta::type_name("EndWeightUpdateReqInput"), x.weight_version, x.abort,
           x.requester);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, EndWeightUpdateReqOutput& x) {
  return f(caf::meta::type_name("EndWeightUpdateReqOutput"), x.success, x.message,
           x.weight_version, x.session_open);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, PostProcessWeightsReqInput& x) {
  return f(caf::meta::type_name("PostProcessWeightsReqInput"), x.restore_weights_before_loading,
           x.post_process_quantization, x.selector);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, PostProcessWeightsReqOutput& x) {
  return f(caf::meta::type_name("PostProcessWeightsReqOutput"), x.success, x.message);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, UpdateWeightVersionReqInput& x) {
  return f(caf::meta::type_name("UpdateWeightVersionReqInput"), x.new_version,
           x.abort_all_requests);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, UpdateWeightVersionReqOutput& x) {
  return f(caf::meta::type_name("UpdateWeightVersionReqOutput"), x.success, x.message,
           x.new_version);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, CheckWeightsReqInput& x) {
  return f(caf::meta::type_name("CheckWeightsReqInput"), x.action, x.allow_quant_error,
           x.skip_tensor_list, x.selector);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ParallelismInfo& x) {
  return f(caf::meta::type_name("ParallelismInfo"), x.tp_rank, x.tp_size, x.dp_rank, x.dp_size,
           x.pp_rank, x.pp_size, x.rank, x.size, x.role);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ChecksumInfo& x) {
  return f(caf::meta::type_name("ChecksumInfo"), x.checksums, x.role_checksums,
           x.per_gpu_checksum, x.parallelism_info);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, CheckWeightsReqOutput& x) {
  return f(caf::meta::type_name("CheckWeightsReqOutput"), x.success, x.message, x.payload,
           x.per_engine_checksum, x.changed, x.unchanged);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, GetWeightsByNameReqInput& x) {
  return f(caf::meta::type_name("GetWeightsByNameReqInput"), x.name, x.truncate_size,
           x.selector);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, GetWeightsByNameReqOutput& x) {
  return f(caf::meta::type_name("GetWeightsByNameReqOutput"), x.success, x.message, x.parameter,
           x.type, x.shape);
}

} // namespace rlserve
