// The CUDA entry points of every kernel op, in a build without CUDA (RLSERVE_CUDA=OFF, or no
// nvcc): each answers not_supported, or an error naming the op, so callers fall back to the CPU
// twins or say why they cannot. All in one file, so a new CUDA op adds its stub here. Compiled
// into every build; empty when the CUDA twins are built.
#ifndef RLSERVE_HAVE_CUDA

#include "kernels/decoder_ops.hpp"
#include "kernels/fill_random.hpp"
#include "kernels/fused_moe.hpp"
#include "kernels/gemm_w4a16.hpp"
#include "kernels/gemm_bf16_invariant.hpp"
#include "kernels/gemv_bf16.hpp"
#include "kernels/int4_quant.hpp"
#include "kernels/moe_bf16.hpp"
#include "kernels/paged_attention.hpp"
#include "kernels/rms_norm.hpp"
#include "kernels/sampler.hpp"
#include "kernels/serving_layout.hpp"
#include "kernels/spec_verify.hpp"
#include "kernels/weight_copy.hpp"

namespace rlserve::kernels {

// kernels/decoder_ops.hpp
kernel_status embed_launch(const embed_args&, cudaStream_t) { return kernel_status::not_supported; }
kernel_status add_rms_norm_launch(const add_rms_norm_args&, cudaStream_t) { return kernel_status::not_supported; }
kernel_status qk_norm_rope_kv_launch(const qk_norm_rope_kv_args&, cudaStream_t) {
  return kernel_status::not_supported;
}
kernel_status silu_mul_bf16_launch(const silu_mul_bf16_args&, cudaStream_t) { return kernel_status::not_supported; }

// kernels/paged_attention.hpp
std::size_t paged_attention_workspace_bytes(const paged_attention_args&) { return 0; }
kernel_status paged_attention_workspace_init(const paged_attention_args&, void*, cudaStream_t) {
  return kernel_status::not_supported;
}
kernel_status paged_attention_launch(const paged_attention_args&, void*, cudaStream_t) {
  return kernel_status::not_supported;
}

// kernels/gemv_bf16.hpp
kernel_status gemv_bf16_launch(const gemv_bf16_args&, cudaStream_t) { return kernel_status::not_supported; }

// kernels/gemm_bf16_invariant.hpp
kernel_status gemm_bf16_invariant_launch(const gemm_bf16_invariant_args&, cudaStream_t) {
  return kernel_status::not_supported;
}

// kernels/moe_bf16.hpp
std::size_t moe_bf16_workspace_bytes(const moe_bf16_args&) { return 0; }
kernel_status moe_bf16_workspace_init(const moe_bf16_args&, void*, cudaStream_t) {
  return kernel_status::not_supported;
}
kernel_status moe_bf16_launch(const moe_bf16_args&, void*, cudaStream_t) { return kernel_status::not_supported; }
int32_t* moe_bf16_topk_ids(const moe_bf16_args&, void*) { return nullptr; }

// kernels/sampler.hpp
std::size_t sample_workspace_bytes(const sample_args&) { return 0; }
kernel_status sample_launch(const sample_args&, void*, cudaStream_t) { return kernel_status::not_supported; }

// kernels/spec_verify.hpp
kernel_status filtered_probs_launch(const filtered_probs_args&, cudaStream_t) { return kernel_status::not_supported; }
kernel_status spec_verify_launch(const spec_verify_args&, cudaStream_t) { return kernel_status::not_supported; }

// kernels/fill_random.hpp
kernel_status fill_random_launch(const fill_random_args&, cudaStream_t) {
  return kernel_status::not_supported;
}

// kernels/fused_moe.hpp
kernel_status moe_topk_launch(const moe_topk_args&, cudaStream_t) { return kernel_status::not_supported; }
kernel_status moe_align_launch(const moe_align_args&, cudaStream_t) { return kernel_status::not_supported; }
std::size_t fused_moe_workspace_bytes(const fused_moe_args&) { return 0; }
kernel_status fused_moe_workspace_init(const fused_moe_args&, void*, cudaStream_t) {
  return kernel_status::not_supported;
}
kernel_status fused_moe_launch(const fused_moe_args&, void*, cudaStream_t) { return kernel_status::not_supported; }
fused_moe_workspace_view fused_moe_workspace_parts(const fused_moe_args&, void*) { return {}; }

// kernels/gemm_w4a16.hpp
std::size_t gemm_w4a16_workspace_bytes(const gemm_w4a16_args&) { return 0; }
kernel_status gemm_w4a16_workspace_init(const gemm_w4a16_args&, void*, cudaStream_t) {
  return kernel_status::not_supported;
}
kernel_status gemm_w4a16_launch(const gemm_w4a16_args&, void*, cudaStream_t) {
  return kernel_status::not_supported;
}

// kernels/int4_quant.hpp
kernel_status int4_quantize_launch(const int4_quant_args&, cudaStream_t) {
  return kernel_status::not_supported;
}
kernel_status int4_quantize_serving_launch(const int4_quant_serving_args&, cudaStream_t) {
  return kernel_status::not_supported;
}
rlserve::status int4_quantize_device(int4_quant_args, std::string_view name, cudaStream_t) {
  return rlserve::fail(int4_shape_message(name, "INT4 quantization", "this build has no CUDA kernels"));
}
rlserve::status int4_quantize_serving_device(int4_quant_serving_args, std::string_view name,
                                             cudaStream_t) {
  return rlserve::fail(int4_shape_message(name, "INT4 quantization", "this build has no CUDA kernels"));
}

// kernels/rms_norm.hpp
kernel_status rms_norm_launch(const rms_norm_args&, cudaStream_t) {
  return kernel_status::not_supported;
}

// kernels/serving_layout.hpp
kernel_status serving_repack_launch(const serving_repack_args&, cudaStream_t) {
  return kernel_status::not_supported;
}
kernel_status serving_restore_launch(const serving_restore_args&, cudaStream_t) {
  return kernel_status::not_supported;
}
rlserve::status serving_repack_device(const serving_repack_args&, std::string_view name, cudaStream_t) {
  return rlserve::fail(int4_shape_message(name, "serving repack", "this build has no CUDA kernels"));
}
rlserve::status serving_restore_device(const serving_restore_args&, std::string_view name, cudaStream_t) {
  return rlserve::fail(int4_shape_message(name, "serving restore", "this build has no CUDA kernels"));
}

// kernels/weight_copy.hpp
kernel_status weight_scan_launch(const weight_batch_args&, cudaStream_t) { return kernel_status::not_supported; }
kernel_status weight_to_bf16_launch(const weight_batch_args&, cudaStream_t) { return kernel_status::not_supported; }
rlserve::expected<std::vector<uint64_t>> weight_scan_device(std::span<const weight_batch_item>, void*, cudaStream_t) {
  return rlserve::fail("weight scan on the device: this build has no CUDA");
}
rlserve::status weight_to_bf16_device(std::span<const weight_batch_item>, void*, cudaStream_t) {
  return rlserve::fail("weight copy on the device: this build has no CUDA");
}

} // namespace rlserve::kernels

#endif // RLSERVE_HAVE_CUDA
