// qwen3_gpu_model: Qwen3 / Qwen3-MoE on one CUDA device, owned by one runner (and its thread).
// The same forward as model/qwen3.hpp, on the device:
//
//   residual (fp32) = embed(ids)
//   per layer:  h = bf16(rmsnorm(residual))                       add_rms_norm (adds the last delta)
//               qkv = h Wqkv^T                                    cuBLAS BF16 (or W4A16 per projection)
//               q, K/V slot = rope(q/k-norm(qkv))                 qk_norm_rope_kv (writes the paged KV)
//               a = paged_attention(q, KV)                        prefill chunks and decode alike
//               delta = a Wo^T;  h = bf16(rmsnorm(residual += delta))
//               dense:  delta = silu_mul(h Wgu^T) Wd^T
//               sparse: router = h Wr^T (fp32);  delta = fused MoE (INT4 experts, or BF16 experts)
//   logits (fp32) = bf16(rmsnorm(residual)) Wlm^T                 cuBLAS, fp32 out (never rounded)
//
// Weights: BF16 on the device, Linear layers in the checkpoint's [out, in] orientation (q/k/v and
// gate/up rows back to back so each pair is one GEMM). INT4 modules (compressed-tensors checkpoints
// or --quantize) live in device buffers with the SERVING / LOAD_FORMAT state machine of
// docs/formats.md ('5a. Quantization methods with state'): restore() turns every INT4 module back
// into the load format on the device (the exact inverse of the repack), upload() writes updated
// tensors in, post_process() repacks. Buffers are allocated once and rewritten in place, so the
// CUDA graphs captured over them stay valid across updates.
//
// The host side stays the source of truth for parameter bytes (a qwen3_model loaded without fp32
// compute copies keeps the canonical tensors for checksums and validation); this class owns only
// device state: weights, the paged KV pool, scratch, cuBLAS, CUDA graphs.
//
// CUDA graphs: a decode step (every sequence one token, one logits row) runs as a graph captured
// once per batch bucket (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, up to
// max_sequences); the batch is padded to the bucket with rows that write no KV and sample nothing.
// Per-step data (ids, positions, slots, block tables, sampling parameters, uniforms) is copied into
// fixed device buffers before the replay. Prefill and mixed batches run eagerly.
//
// Not thread safe: one runner thread calls everything (the CUDA device is current on it).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kernels/int4_format.hpp"
#include "messages/tensor.hpp"
#include "messages/expected.hpp"
#include "model/config.hpp"
#include "model/qwen3.hpp"

namespace rlserve::model {

struct gpu_options {
  int device = 0;
  int64_t kv_block_size = 16;
  int64_t kv_num_blocks = 2048;
  int64_t max_batch_tokens = 2048; // rows one forward may run (prefill chunk + decodes)
  int64_t max_sequences = 256;     // sequences one forward may hold; the largest graph bucket
  int64_t max_logit_rows = 0;      // logits rows one forward may ask for (0: max_batch_tokens)
  bool cuda_graphs = true;
  // BF16 linear layers where kernels::gemv_bf16_preferred says so (batch-1 decode: the attention
  // projections, routers and lm_head; the routers up to 8 rows) on the project's GEMV
  // (kernels/gemv_bf16.hpp) rather than cuBLAS; off only to compare the two
  // (decode_bench --linears cublas).
  bool bf16_gemv = true;
  // The batch-invariant forward (serve --enable-deterministic-inference): a sequence's logits do
  // not depend on the other sequences of its batch or on how its prompt was chunked. Every op
  // is then per row or runs its batch-invariant form: BF16 linears on
  // kernels::gemm_bf16_invariant (not cuBLAS or the GEMV), INT4 linears and the INT4 fused MoE with
  // whole tiles at one block size (batch_invariant of their args); norms, RoPE, the paged
  // attention (splits set by a row's own context length) and the sampler are per row already.
  // decode_bench --batch-invariant measures what it costs.
  bool batch_invariant = false;
  // Device bytes a weight update may stage before its commit (0: as many as the weights take,
  // i.e. one full copy of the model).
  std::size_t staging_budget_bytes = 0;
  // Host bytes of an update go to the device in chunks of this size, the next chunk's upload
  // overlapping this chunk's quantization (tests set it small to run many chunks).
  std::size_t upload_chunk_bytes = std::size_t{1} << 30;
};

// One decode row's sampling request (forward_sample): model::sampler's rule, evaluated on the
// device; `uniform` is the request's own draw (its host sampler), ignored when greedy.
struct gpu_sample_row {
  float temperature = 0.0f;
  int32_t top_k = -1;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float uniform = 0.0f;
};

// Speculative decoding on the device: one of the leading items of a forward (forward's `spec`)
// that draws or verifies there (kernels/spec_verify.hpp), so no distribution leaves the device.
//   verify (draft_tokens = the k proposals): the item runs its pending token and the k proposals
//     (k + 1 tokens, k + 1 logits rows); the target's filtered distributions p are checked
//     against the draft's q rows (draft_rows) by rejection sampling, or by argmax when greedy.
//   propose (draft_tokens empty): the item asks for one logits row; one token is drawn from its
//     filtered distribution, which is written to keep_row (the draft's q for the verification).
struct gpu_spec_item {
  gpu_sample_row sampling;                  // temperature 0: greedy; `uniform` is not used
  std::span<const int32_t> draft_tokens;    // verify: the k proposals (k <= 8); propose: empty
  std::span<const float> uniforms;          // sampled: k + 1, in spec_verify's draw order
  std::span<const float* const> draft_rows; // sampled verify: the k device rows q was drawn from
  float* keep_row = nullptr;                // propose: a device row of vocab floats for q (may be null)
};
// Per spec item s, rows row_s .. row_s + k_s (row_s = the rows of the items before it):
// tokens = the kept proposals, then the correction or bonus (or the proposal), -1 after it;
// logprobs = log_softmax(logits / T) of each token (T = 1 when greedy), -inf after it.
struct gpu_spec_result {
  std::vector<int32_t> accepted; // per item: proposals kept (a proposal: 0)
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
};

// Random INT4 experts for create_random (benchmarks).
struct random_int4 {
  int32_t group_size = 128;
  bool symmetric = false;
};

// What the device buffers of one INT4 module hold, for tests (downloaded words).
struct gpu_int4_snapshot {
  std::string name;
  kernels::int4_shape shape;
  bool serving = true;
  std::vector<int32_t> weight;
  std::vector<uint16_t> scale;
  std::vector<int32_t> zero_point;
};

class qwen3_gpu_model {
public:
  // Uploads `host` (BF16 modules, and INT4 modules through their load-format tensors, repacked on
  // the device). Fails naming the reason: no CUDA device, a build without CUDA, out of memory,
  // a shape the kernels cannot run.
  static expected<std::unique_ptr<qwen3_gpu_model>> create(const qwen3_model& host,
                                                           const gpu_options& options);
  // Random weights generated on the device (no checkpoint): BF16, or INT4 experts when `int4`.
  static expected<std::unique_ptr<qwen3_gpu_model>>
  create_random(const model_config& config, std::optional<random_int4> int4, uint64_t seed,
                const gpu_options& options);
  ~qwen3_gpu_model();
  qwen3_gpu_model(const qwen3_gpu_model&) = delete;
  qwen3_gpu_model& operator=(const qwen3_gpu_model&) = delete;

  const model_config& config() const;
  const gpu_options& options() const;
  std::string device_name() const; // "cuda:0 (NVIDIA H200)"
  // Device bytes held by weights and by the KV pool.
  std::size_t weight_bytes() const;
  std::size_t kv_bytes() const;

  // qwen3_model::forward's contract over the device KV pool: items' blocks index this model's
  // pool; on success each kv->length grows by its token count and `logits` holds, item after
  // item, the rows each asked for ([sum of logit_rows, vocab], copied to the host).
  // With `routed_experts` (a MoE model), also the router's top-k experts of every token that ran,
  // [tokens, layers, top_k] item after item, -1 for dense layers — qwen3_model::forward's
  // routing replay (that forward runs without CUDA graphs).
  status forward(std::span<forward_item> items, std::vector<float>& logits,
                 std::vector<int32_t>* routed_experts = nullptr);
  // The same forward whose first spec.size() items draw or verify on the device (gpu_spec_item):
  // their rows stay there, `spec_out` gets their tokens, and `logits` holds only the rows of
  // the items after them. Everything is checked before anything runs.
  status forward(std::span<forward_item> items, std::vector<float>& logits,
                 std::vector<int32_t>* routed_experts, std::span<const gpu_spec_item> spec,
                 gpu_spec_result& spec_out);
  // Decode fast path: every item one token and one logits row; samples on the device (one row
  // each) and brings back only tokens and logprobs. Runs as a CUDA graph when graphs are on.
  // `routed_experts` as forward's ([items, layers, top_k]; the recording graphs).
  status forward_sample(std::span<forward_item> items, std::span<const gpu_sample_row> rows,
                        std::vector<int32_t>& tokens, std::vector<float>& logprobs,
                        std::vector<int32_t>* routed_experts = nullptr);

  // kv_pool::copy_slots on the device pool, queued on the model's stream before the next
  // forward (a prefix cache's copy-on-write of a partly shared block).
  status copy_kv_slots(int32_t from, int32_t to, int64_t slots);

  // ---- giving GPU memory back to a colocated trainer (release_memory_occupation) ----
  // The tags of SGLang's release/resume: the weights, the KV pool, and "cuda_graph" — the rest of
  // the forward's memory (activations and workspaces its graphs replay into, the RoPE table).
  struct memory_tags {
    bool weights = false;
    bool kv_cache = false;
    bool cuda_graph = false;
  };
  // Gives the physical memory of the tagged parts back to the driver (CUDA virtual memory: the
  // addresses stay reserved, so the CUDA graphs stay valid). With `backup_weights` the weights go
  // to pinned host memory first and come back on resume; otherwise they are undefined after
  // resume until an update writes them. The KV pool comes back zeroed. While anything is
  // released, forward refuses; while the weights are, every weight operation refuses, naming
  // what to resume. What updates need besides the weights is never released.
  status release_memory(memory_tags tags, bool backup_weights);
  status resume_memory(memory_tags tags);
  memory_tags released_memory() const;
  std::size_t mapped_bytes() const; // device memory the model's arenas hold now

  // ---- weight updates (the INT4 state machine on the device) ----
  // Every INT4 module SERVING -> LOAD_FORMAT (modules already in load format are left alone).
  // Forward refuses to run while any module is in load format.
  expected<std::string> restore();
  // Copies the named parameters from `host` (after host.assign): BF16 tensors into their device
  // slots, INT4 ones into their module's load-format buffers (restoring that module first if it
  // is serving). Names are canonical parameter names or `<prefix>.weight` of an INT4 module.
  status upload(const qwen3_model& host, std::span<const std::string> names);
  // Every INT4 module LOAD_FORMAT -> SERVING.
  expected<std::string> post_process();

  // ---- weight updates staged on the device ----
  // The serving weights never change before commit_staged(): updates are checked whole, then
  // written into a staging area on the device (BF16 parameters as converted copies; each touched
  // INT4 module as a load-format copy of the whole module, taken from the serving buffers and
  // overwritten by what arrives), and commit writes the staging area into the serving buffers in
  // place (same addresses: the CUDA graphs stay valid).
  //
  // One tensor of an update in device memory (a trainer's CUDA IPC mapping, or host bytes
  // uploaded here). Names: the canonical parameter names, for an INT4 module also its BF16
  // `<prefix>.weight` (quantized here with the module's recipe) or its load-format tensors.
  struct update_source {
    std::string name;
    const void* data = nullptr;
    dtype type = dtype::bf16;
    std::vector<int64_t> shape;
  };
  // All or nothing per call: every name, dtype and shape is checked and every float is scanned
  // for NaN/Inf (one launch for the whole call; skipped with `allow_nonfinite`) before anything is
  // written; a refused call leaves the staging area as it was. A later call may restage a name
  // (the last one wins). Reads of `data` are finished when this returns. Fails too when the
  // staging area would outgrow gpu_options::staging_budget_bytes.
  status stage(std::span<const update_source> tensors, bool allow_nonfinite);
  // Host tensors: copied to the device (through a pinned buffer, the next chunk's copy overlapping
  // this chunk's staging), then as stage(), in chunks of up to 1 GiB: all or nothing per chunk; a
  // refusal after the first chunk drops everything staged in the session (the message says so).
  status stage_host(std::span<const NamedTensor> tensors, bool allow_nonfinite);
  // Writes the staging area into the serving buffers (INT4 modules repacked from their staged
  // load format; a module left in load format by restore() gets the load format) and frees it.
  expected<std::string> commit_staged();
  // Frees the staging area; the serving weights are untouched.
  void discard_staged();
  std::size_t staged_bytes() const;
  std::size_t staging_peak_bytes() const; // the most the staging area held since create
  // The recipe BF16 updates of INT4 modules are quantized with (none: no INT4 module).
  std::optional<kernels::int4_recipe> int4_update_recipe() const;

  // ---- what is served, read back from the device ----
  // Canonical load-format bytes of each named parameter as the device serves them (INT4 modules
  // restored on the device into scratch; a parameter the checkpoint keeps in f32/f16 is served,
  // and read back, as its bf16 rounding). `visit` gets the parameters in groups (all BF16 ones,
  // then one INT4 module's): their indices into `names`, device pointers and byte counts, valid
  // during the call only.
  using parameter_visitor =
    std::function<status(std::span<const std::size_t>, std::span<const void* const>, std::span<const std::size_t>)>;
  status read_parameters(std::span<const std::string> names, const parameter_visitor& visit);
  // XXH3-64 of each named parameter's served bytes (read_parameters), hashed on the device.
  expected<std::vector<uint64_t>> digests(std::span<const std::string> names);
  // One parameter's served bytes on the host, with the dtype and shape they have on the device.
  expected<HostTensor> download(const std::string& name);

  // ---- tests and benchmarks ----
  std::vector<std::string> int4_module_names() const;
  expected<gpu_int4_snapshot> int4_module(const std::string& name) const;
  int64_t graphs_captured() const;
  // With RLSERVE_GPU_PROFILE set: milliseconds per phase (GEMMs, attention, MoE, norms, sampler)
  // summed since the last call, steps run eagerly with an event between phases. Empty otherwise.
  std::vector<std::pair<std::string, double>> take_profile();

  struct impl;
  struct staging;

private:
  explicit qwen3_gpu_model(std::unique_ptr<impl> p);
  struct host_upload {
    void* device = nullptr;      // one buffer for a chunk's tensors
    std::vector<std::size_t> at; // each tensor's offset in it
  };
  status upload_chunk(std::span<const NamedTensor> tensors, host_upload& out);
  std::unique_ptr<impl> impl_;
  std::unique_ptr<staging> staging_;
};

// Whether this build has CUDA and a device is visible (what Engine uses to pick the GPU runner).
bool gpu_available();

// Device-to-device cudaMemcpy bandwidth in bytes/s, counting the read and the write of every byte
// (the ceiling the decode roofline divides by).
expected<double> gpu_copy_bandwidth(int device, std::size_t bytes, int repeats);

// Opens (true) or closes (false) the range a profiler started with `--profile-from-start off`
// collects (Nsight Compute: cudaProfilerStart / cudaProfilerStop), so a benchmark can have exactly
// its steady-state launches profiled. Nothing without CUDA or without a profiler attached.
void gpu_profiler_range(bool open);

} // namespace rlserve::model
