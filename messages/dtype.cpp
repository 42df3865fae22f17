#include "messages/dtype.hpp"

#include <array>
#include <utility>

namespace rlserve {

namespace {

struct dtype_names {
  dtype type;
  std::string_view torch;
  std::string_view safetensors;
};

constexpr std::array<dtype_names, 10> k_names{{
  {dtype::f32, "float32", "F32"},
  {dtype::f16, "float16", "F16"},
  {dtype::bf16, "bfloat16", "BF16"},
  {dtype::f64, "float64", "F64"},
  {dtype::i8, "int8", "I8"},
  {dtype::u8, "uint8", "U8"},
  {dtype::i16, "int16", "I16"},
  {dtype::i32, "int32", "I32"},
  {dtype::i64, "int64", "I64"},
  {dtype::boolean, "bool", "BOOL"},
}};

} // namespace

std::string_view torch_name(dtype t) {
  for (const auto& n : k_names)
    if (n.type == t)
      return n.torch;
  return "invalid";
}

std::string_view safetensors_name(dtype t) {
  for (const auto& n : k_names)
    if (n.type == t)
      return n.safetensors;
  return "INVALID";
}

std::optional<dtype> dtype_from_torch_name(std::string_view name) {
  if (name.starts_with("torch."))
    name.remove_prefix(6);
  for (const auto& n : k_names)
    if (n.torch == name)
      return n.type;
  // PyTorch's own aliases, as str(torch.float) etc. never print them but users type them.
  static constexpr std::array<std::pair<std::string_view, dtype>, 5> aliases{{
    {"float", dtype::f32}, {"half", dtype::f16}, {"double", dtype::f64},
    {"long", dtype::i64}, {"int", dtype::i32},
  }};
  for (const auto& [alias, t] : aliases)
    if (alias == name)
      return t;
  return std::nullopt;
}

std::optional<dtype> dtype_from_safetensors_name(std::string_view name) {
  for (const auto& n : k_names)
    if (n.safetensors == name)
      return n.type;
  return std::nullopt;
}

} // namespace rlserve
