// Element types of tensors that cross rlserve's boundaries (checkpoints, trainer updates, kernels).
// Two spellings matter to users: PyTorch's ("bfloat16", as trainers send in
// UpdateWeightsFromDistributedReqInput.dtypes) and safetensors' ("BF16", in file headers).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace rlserve {

enum class dtype : uint8_t {
  f32 = 1,
  f16,
  bf16,
  f64,
  i8,
  u8,
  i16,
  i32,
  i64,
  boolean,
};

constexpr std::size_t element_size(dtype t) {
  switch (t) {
    case dtype::f64:
    case dtype::i64: return 8;
    case dtype::f32:
    case dtype::i32: return 4;
    case dtype::f16:
    case dtype::bf16:
    case dtype::i16: return 2;
    case dtype::i8:
    case dtype::u8:
    case dtype::boolean: return 1;
  }
  return 0;
}

// PyTorch name without the "torch." prefix: "float32", "bfloat16", "int32", "bool", ...
std::string_view torch_name(dtype t);
// safetensors header name: "F32", "BF16", "I32", "BOOL", ...
std::string_view safetensors_name(dtype t);
// Accepts PyTorch names (with or without "torch.", plus the aliases "float", "half", "long",
// "int") ; nullopt for anything else.
std::optional<dtype> dtype_from_torch_name(std::string_view name);
std::optional<dtype> dtype_from_safetensors_name(std::string_view name);

// The PyTorch name; also what CAF's deep_to_string prints for a dtype field.
inline std::string to_string(dtype t) { return std::string(torch_name(t)); }

} // namespace rlserve
