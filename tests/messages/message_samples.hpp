// Test support for tests/messages: field-by-field equality for every message struct, a check
// that a sample sets every field to something other than its default, and the samples
// themselves (one "full" sample per type with every field non-default and every optional set,
// plus variants: optionals unset, and the shapes the JSON contract requires).
//
// Equality is generated from structured bindings with the field count written here, so a field
// added to a struct breaks this file's build until the count (and the samples) follow. That is
// the point: a field that inspect() or a codec forgets can only be caught by a comparison that
// knows every field.
#pragma once

#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "messages/all.hpp"
#include "messages/enums.hpp"
#include "messages/expected.hpp"

namespace rlserve_test {

template <class T>
struct field_count; // no definition: a type without a count here is not comparable

#define RLSERVE_FIELD_COUNT(type, n)                                                             \
  template <>                                                                                    \
  struct field_count<rlserve::type> : std::integral_constant<std::size_t, n> {};

// generate.hpp
RLSERVE_FIELD_COUNT(SamplingParams, 19)
RLSERVE_FIELD_COUNT(GenerateReqInput, 12)
RLSERVE_FIELD_COUNT(TokenizedGenerateReqInput, 12)
RLSERVE_FIELD_COUNT(FinishReason, 4)
RLSERVE_FIELD_COUNT(TopLogprob, 3)
RLSERVE_FIELD_COUNT(GenerateReqOutput, 28)
RLSERVE_FIELD_COUNT(TokenChunks, 1)
RLSERVE_FIELD_COUNT(WeightVersionSpan, 2)
RLSERVE_FIELD_COUNT(AbortReq, 3)
RLSERVE_FIELD_COUNT(AbortReqOutput, 3)
// tensor.hpp (HostTensor has its own equality below; the count still guards its layout)
RLSERVE_FIELD_COUNT(HostTensor, 4)
RLSERVE_FIELD_COUNT(NamedTensor, 2)
RLSERVE_FIELD_COUNT(DeviceTensorRef, 12)
// weight_update.hpp
RLSERVE_FIELD_COUNT(InitWeightsUpdateGroupReqInput, 8)
RLSERVE_FIELD_COUNT(InitWeightsUpdateGroupReqOutput, 2)
RLSERVE_FIELD_COUNT(DestroyWeightsUpdateGroupReqInput, 1)
RLSERVE_FIELD_COUNT(DestroyWeightsUpdateGroupReqOutput, 2)
RLSERVE_FIELD_COUNT(UpdateWeightsFromDistributedReqInput, 13)
RLSERVE_FIELD_COUNT(UpdateWeightsFromDistributedReqOutput, 2)
RLSERVE_FIELD_COUNT(NamedDeviceTensor, 2)
RLSERVE_FIELD_COUNT(UpdateWeightsFromTensorReqInput, 9)
RLSERVE_FIELD_COUNT(UpdateWeightsFromTensorReqOutput, 2)
RLSERVE_FIELD_COUNT(UpdateWeightFromDiskReqInput, 11)
RLSERVE_FIELD_COUNT(UpdateWeightFromDiskReqOutput, 3)
RLSERVE_FIELD_COUNT(BeginWeightUpdateReqInput, 2)
RLSERVE_FIELD_COUNT(BeginWeightUpdateReqOutput, 2)
RLSERVE_FIELD_COUNT(EndWeightUpdateReqInput, 3)
RLSERVE_FIELD_COUNT(EndWeightUpdateReqOutput, 4)
RLSERVE_FIELD_COUNT(PostProcessWeightsReqInput, 3)
RLSERVE_FIELD_COUNT(PostProcessWeightsReqOutput, 2)
RLSERVE_FIELD_COUNT(UpdateWeightVersionReqInput, 2)
RLSERVE_FIELD_COUNT(UpdateWeightVersionReqOutput, 3)
RLSERVE_FIELD_COUNT(CheckWeightsReqInput, 4)
RLSERVE_FIELD_COUNT(ParallelismInfo, 9)
RLSERVE_FIELD_COUNT(ChecksumInfo, 4)
RLSERVE_FIELD_COUNT(CheckWeightsReqOutput, 6)
RLSERVE_FIELD_COUNT(GetWeightsByNameReqInput, 3)
RLSERVE_FIELD_COUNT(GetWeightsByNameReqOutput, 5)
// control.hpp
RLSERVE_FIELD_COUNT(PauseGenerationReqInput, 1)
RLSERVE_FIELD_COUNT(PauseGenerationReqOutput, 2)
RLSERVE_FIELD_COUNT(ContinueGenerationReqInput, 1)
RLSERVE_FIELD_COUNT(ContinueGenerationReqOutput, 2)
RLSERVE_FIELD_COUNT(FlushCacheReqInput, 1)
RLSERVE_FIELD_COUNT(FlushCacheReqOutput, 2)
RLSERVE_FIELD_COUNT(ReleaseMemoryOccupationReqInput, 1)
RLSERVE_FIELD_COUNT(ReleaseMemoryOccupationReqOutput, 2)
RLSERVE_FIELD_COUNT(ResumeMemoryOccupationReqInput, 1)
RLSERVE_FIELD_COUNT(ResumeMemoryOccupationReqOutput, 2)
RLSERVE_FIELD_COUNT(GetServerInfoReqInput, 0)
RLSERVE_FIELD_COUNT(GetServerInfoReqOutput, 36)
RLSERVE_FIELD_COUNT(HealthCheckReqInput, 0)
RLSERVE_FIELD_COUNT(HealthCheckReqOutput, 2)
// runner.hpp
RLSERVE_FIELD_COUNT(SequenceWork, 18)
RLSERVE_FIELD_COUNT(ForwardBatch, 4)
RLSERVE_FIELD_COUNT(WorkResult, 11)
RLSERVE_FIELD_COUNT(ForwardBatchOutput, 7)
RLSERVE_FIELD_COUNT(ReleaseSequences, 1)
RLSERVE_FIELD_COUNT(TensorSpec, 3)
RLSERVE_FIELD_COUNT(TensorAlias, 2)
RLSERVE_FIELD_COUNT(RunnerCapabilities, 6)
RLSERVE_FIELD_COUNT(RunnerManifest, 14)
RLSERVE_FIELD_COUNT(StageTensors, 1)
RLSERVE_FIELD_COUNT(StageDeviceTensors, 1)
RLSERVE_FIELD_COUNT(RunnerReply, 3)
RLSERVE_FIELD_COUNT(JoinWeightGroup, 3)
RLSERVE_FIELD_COUNT(ReceiveBroadcast, 4)
RLSERVE_FIELD_COUNT(ReceivedBroadcast, 5)
RLSERVE_FIELD_COUNT(ReleaseBroadcast, 1)
RLSERVE_FIELD_COUNT(RunnerCheckOutput, 7)
RLSERVE_FIELD_COUNT(WeightUpdaterStatus, 4)

#undef RLSERVE_FIELD_COUNT

// The error text of an expected<T>, or "" when it holds a value. Boost.Test builds a check's
// message even when the check passes, so tests must not call error() on a value.
template <class T>
std::string error_text(const rlserve::expected<T>& x) {
  return x.has_value() ? std::string() : x.error();
}

template <class T>
concept counted = requires { field_count<T>::value; };

// Generated shape: one branch per field count; structured bindings fail to compile when N is
// not the struct's exact number of fields.
template <std::size_t N, class T>
auto tie_fields(const T& x) {
  if constexpr (N == 0) {
    return std::tie();
  } else if constexpr (N == 1) {
    const auto& [f0] = x;
    return std::tie(f0);
  } else if constexpr (N == 2) {
    const auto& [f0, f1] = x;
    return std::tie(f0, f1);
  } else if constexpr (N == 3) {
    const auto& [f0, f1, f2] = x;
    return std::tie(f0, f1, f2);
  } else if constexpr (N == 4) {
    const auto& [f0, f1, f2, f3] = x;
    return std::tie(f0, f1, f2, f3);
  } else if constexpr (N == 5) {
    const auto& [f0, f1, f2, f3, f4] = x;
    return std::tie(f0, f1, f2, f3, f4);
  } else if constexpr (N == 6) {
    const auto& [f0, f1, f2, f3, f4, f5] = x;
    return std::tie(f0, f1, f2, f3, f4, f5);
  } else if constexpr (N == 7) {
    const auto& [f0, f1, f2, f3, f4, f5, f6] = x;
    return std::tie(f0, f1, f2, f3, f4, f5, f6);
  } else if constexpr (N == 8) {
    const auto& [f0, f1, f2, f3, f4, f5, f6, f7] = x;
    return std::tie(f0, f1, f2, f3, f4, f5, f6, f7);
  } else if constexpr (N == 9) {
    const auto& [f0, f1, f2, f3, f4, f5, f6, f7, f8] = x;
    return std::tie(f0, f1, f2, f3, f4, f5, f6, f7, f8);
  } else if constexpr (N == 10) {
    const auto& [f0, f1, f2, f3, f4, f5, f6, f7, f8, f9] = x;
    return std::tie(f0, f1, f2, f3, f4, f5, f6, f7, f8, f9);
  } else if constexpr (N == 11) {
    const auto& [f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10] = x;
    return std::tie(f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10);
  } else if constexpr (N == 12) {
    const auto& [f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11] = x;
    return std::tie(f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11);
  } else if constexpr (N == 13) {
    const auto& [f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12] = x;
    return std::tie(f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12);
  } else if constexpr (N == 14) {
    const auto& [f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13] = x;
    return std::tie(f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13);
  } else if constexpr (N == 15) {
    const auto& [f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14] = x;
    return std::tie(f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14);
  } else if constexpr (N == 16) {
    const auto& [f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15] = x;
    return std::tie(f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15);
  } else if constexpr (N == 17) {
    const auto& [f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16] = x;
    return std::tie(f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16);
  } else if constexpr (N == 18) {
    const auto& [f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17] = x;
    return std::tie(f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17);
  } else if constexpr (N == 19) {
    const auto& [f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17, f18] = x;
    return std::tie(f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17, f18);
  } else if constexpr (N == 20) {
    const auto& [f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17, f18, f19] = x;
    return std::tie(f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17, f18, f19);
  } else if constexpr (N == 21) {
    const auto& [f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17, f18, f19, f20] = x;
    return std::tie(f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17, f18, f19, f20);
  } else if constexpr (N == 22) {
    const auto& [f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17, f18, f19, f20, f21] = x;
    return std::tie(f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17, f18, f19, f20, f21);
  } else if constexpr (N == 23) {
    const auto& [f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17, f18, f19, f20, f21, f22] = x;
    return std::tie(f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17, f18, f19, f20, f21, f22);
  } else if constexpr (N == 24) {
    const auto& [f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17, f18, f19, f20, f21, f22, f23] = x;
    return std::tie(f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17, f18, f19, f20, f21, f22, f23);
  } else if constexpr (N == 25) {
    const auto& [f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17, f18, f19, f20, f21, f22, f23, f24] = x;
    return std::tie(f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17, f18, f19, f20, f21, f22, f23, f24);
  } else if constexpr (N == 26) {
    const auto& [f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17, f18, f19, f20, f21, f22, f23, f24, f25] = x;
    return std::tie(f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17, f18, f19, f20, f21, f22, f23, f24, f25);
  } else if constexpr (N == 27) {
    const auto& [f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17, f18, f19, f20, f21, f22, f23, f24, f25, f26] = x;
    return std::tie(f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17, f18, f19, f20, f21, f22, f23, f24, f25, f26);
  } else if constexpr (N == 28) {
    const auto& [f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17, f18, f19, f20, f21, f22, f23, f24, f25, f26, f27] = x;
    return std::tie(f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17, f18, f19, f20, f21, f22, f23, f24, f25, f26, f27);
  } else if constexpr (N == 29) {
    const auto& [f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17, f18, f19, f20, f21, f22, f23, f24, f25, f26, f27, f28] = x;
    return std::tie(f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17, f18, f19, f20, f21, f22, f23, f24, f25, f26, f27, f28);
  } else if constexpr (N == 30) {
    const auto& [f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17, f18, f19, f20, f21, f22, f23, f24, f25, f26, f27, f28, f29] = x;
    return std::tie(f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17, f18, f19, f20, f21, f22, f23, f24, f25, f26, f27, f28, f29);
  } else if constexpr (N == 31) {
    const auto& [f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17, f18, f19, f20, f21, f22, f23, f24, f25, f26, f27, f28, f29, f30] = x;
    return std::tie(f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17, f18, f19, f20, f21, f22, f23, f24, f25, f26, f27, f28, f29, f30);
  } else if constexpr (N == 32) {
    const auto& [f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17, f18, f19, f20, f21, f22, f23, f24, f25, f26, f27, f28, f29, f30, f31] = x;
    return std::tie(f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17, f18, f19, f20, f21, f22, f23, f24, f25, f26, f27, f28, f29, f30, f31);
  } else if constexpr (N == 33) {
    const auto& [f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17, f18, f19, f20, f21, f22, f23, f24, f25, f26, f27, f28, f29, f30, f31, f32] = x;
    return std::tie(f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17, f18, f19, f20, f21, f22, f23, f24, f25, f26, f27, f28, f29, f30, f31, f32);
  } else if constexpr (N == 34) {
    const auto& [f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17, f18, f19, f20, f21, f22, f23, f24, f25, f26, f27, f28, f29, f30, f31, f32, f33] = x;
    return std::tie(f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17, f18, f19, f20, f21, f22, f23, f24, f25, f26, f27, f28, f29, f30, f31, f32, f33);
  } else if constexpr (N == 35) {
    const auto& [f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17, f18, f19, f20, f21, f22, f23, f24, f25, f26, f27, f28, f29, f30, f31, f32, f33, f34] = x;
    return std::tie(f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17, f18, f19, f20, f21, f22, f23, f24, f25, f26, f27, f28, f29, f30, f31, f32, f33, f34);
  } else if constexpr (N == 36) {
    const auto& [f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17, f18, f19, f20, f21, f22, f23, f24, f25, f26, f27, f28, f29, f30, f31, f32, f33, f34, f35] = x;
    return std::tie(f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17, f18, f19, f20, f21, f22, f23, f24, f25, f26, f27, f28, f29, f30, f31, f32, f33, f34, f35);
  } else if constexpr (N == 37) {
    const auto& [f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17, f18, f19, f20, f21, f22, f23, f24, f25, f26, f27, f28, f29, f30, f31, f32, f33, f34, f35, f36] = x;
    return std::tie(f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17, f18, f19, f20, f21, f22, f23, f24, f25, f26, f27, f28, f29, f30, f31, f32, f33, f34, f35, f36);
  } else if constexpr (N == 38) {
    const auto& [f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17, f18, f19, f20, f21, f22, f23, f24, f25, f26, f27, f28, f29, f30, f31, f32, f33, f34, f35, f36, f37] = x;
    return std::tie(f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17, f18, f19, f20, f21, f22, f23, f24, f25, f26, f27, f28, f29, f30, f31, f32, f33, f34, f35, f36, f37);
  } else if constexpr (N == 39) {
    const auto& [f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17, f18, f19, f20, f21, f22, f23, f24, f25, f26, f27, f28, f29, f30, f31, f32, f33, f34, f35, f36, f37, f38] = x;
    return std::tie(f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17, f18, f19, f20, f21, f22, f23, f24, f25, f26, f27, f28, f29, f30, f31, f32, f33, f34, f35, f36, f37, f38);
  } else if constexpr (N == 40) {
    const auto& [f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17, f18, f19, f20, f21, f22, f23, f24, f25, f26, f27, f28, f29, f30, f31, f32, f33, f34, f35, f36, f37, f38, f39] = x;
    return std::tie(f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17, f18, f19, f20, f21, f22, f23, f24, f25, f26, f27, f28, f29, f30, f31, f32, f33, f34, f35, f36, f37, f38, f39);
  } else {
    static_assert(N <= 40, "extend tie_fields");
  }
}

template <class T>
auto fields(const T& x) {
  return tie_fields<field_count<T>::value>(x);
}

} // namespace rlserve_test

namespace rlserve {

// Found by argument-dependent lookup, also from inside std::tuple / std::vector / std::optional
// comparisons of nested messages.
template <class T>
  requires rlserve_test::counted<T>
bool operator==(const T& a, const T& b) {
  return rlserve_test::fields(a) == rlserve_test::fields(b);
}

// Bytes compared byte for byte; where they live (shared, aliased or copied) does not matter.
inline bool operator==(const HostTensor& a, const HostTensor& b) {
  (void) rlserve_test::fields(a); // keeps the field count honest
  return a.type == b.type && a.shape == b.shape && a.nbytes == b.nbytes &&
         (a.nbytes == 0 || std::memcmp(a.data.get(), b.data.get(), a.nbytes) == 0);
}

} // namespace rlserve

namespace rlserve_test {

// Indices of the fields of `x` that still equal a default-constructed T's.
template <class T>
std::vector<std::size_t> default_fields(const T& x) {
  const T def{};
  std::vector<std::size_t> out;
  auto a = fields(x);
  auto b = fields(def);
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    ((std::get<I>(a) == std::get<I>(b) ? out.push_back(I) : void()), ...);
  }(std::make_index_sequence<field_count<T>::value>{});
  return out;
}

// Indices of the fields that are default in every one of `samples` (fields no sample covers).
template <class T>
std::vector<std::size_t> uncovered_fields(const std::vector<T>& samples) {
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < field_count<T>::value; ++i) {
    bool covered = false;
    for (const auto& s : samples) {
      auto d = default_fields(s);
      if (std::find(d.begin(), d.end(), i) == d.end())
        covered = true;
    }
    if (!covered)
      out.push_back(i);
  }
  return out;
}

// ---- samples ------------------------------------------------------------------------------------

// samples<T>::full(): every field non-default, optionals set (CAF round trips use it; it may
// break JSON-level rules such as "text or input_ids"). samples<T>::json(): values that satisfy
// the JSON contract, which together set every field at least once except those listed in
// samples<T>::json_default_only (fields whose only valid JSON value is the default).
template <class T>
struct samples;

inline rlserve::HostTensor host_tensor(rlserve::dtype type, std::vector<int64_t> shape,
                                       uint8_t seed) {
  int64_t n = 1;
  for (auto d : shape)
    n *= d;
  std::vector<std::byte> bytes(static_cast<std::size_t>(n) * rlserve::element_size(type));
  for (std::size_t i = 0; i < bytes.size(); ++i)
    bytes[i] = static_cast<std::byte>((i * 37 + seed) & 0xff); // every byte differs from its neighbours
  return rlserve::HostTensor::adopt(type, std::move(shape), std::move(bytes));
}

inline std::vector<uint8_t> ipc_handle_bytes() {
  std::vector<uint8_t> h(64);
  for (std::size_t i = 0; i < h.size(); ++i)
    h[i] = static_cast<uint8_t>(255 - i * 3);
  return h;
}

// PyTorch's shareable form: version 2, type 'c', then the 64-byte cudaIpcMemHandle_t.
inline std::vector<uint8_t> torch_ipc_handle_bytes() {
  std::vector<uint8_t> h{2, 'c'};
  auto raw = ipc_handle_bytes();
  h.insert(h.end(), raw.begin(), raw.end());
  return h;
}

inline std::string nccl_unique_id_hex() {
  std::string s;
  static constexpr char digits[] = "0123456789abcdef";
  for (int i = 0; i < 256; ++i)
    s += digits[(i * 7 + 3) % 16];
  return s;
}

template <class T>
struct simple_samples {
  static std::vector<T> json() { return {samples<T>::full()}; }
  static std::vector<std::size_t> json_default_only() { return {}; }
};

template <class T>
struct status_samples : simple_samples<T> {
  static T full() {
    T x;
    x.success = false;
    x.message = "it failed: \"why\"\n";
    return x;
  }
};

using namespace rlserve;

template <>
struct samples<SamplingParams> : simple_samples<SamplingParams> {
  static SamplingParams full() {
    SamplingParams x;
    x.max_new_tokens = 64;
    x.stop = {"\n\n", "END"};
    x.stop_token_ids = {2, 151643};
    x.temperature = 0.7f;
    x.top_p = 0.9f;
    x.top_k = 40;
    x.min_p = 0.05f;
    x.frequency_penalty = 0.5f;
    x.presence_penalty = -0.25f;
    x.repetition_penalty = 1.1f;
    x.min_new_tokens = 4;
    x.n = 2;
    x.ignore_eos = true;
    x.skip_special_tokens = false;
    x.spaces_between_special_tokens = false;
    x.no_stop_trim = true;
    x.sampling_seed = UINT64_MAX;
    x.stream_interval = 8;
    x.return_top_p_token_ids = true;
    return x;
  }
  static SamplingParams sparse() {
    auto x = full();
    x.sampling_seed.reset();
    x.stream_interval.reset();
    return x;
  }
  static std::vector<SamplingParams> json() { return {full(), sparse()}; }
};

template <>
struct samples<GenerateReqInput> : simple_samples<GenerateReqInput> {
  static GenerateReqInput full() {
    GenerateReqInput x;
    x.rid = "req-1";
    x.text = "Hello, w\xc3\xb6rld";
    x.input_ids = std::vector<int32_t>{1, 2, 3};
    x.sampling_params = samples<SamplingParams>::full();
    x.return_logprob = true;
    x.logprob_start_len = 0;
    x.top_logprobs_num = 5;
    x.return_text_in_logprobs = true;
    x.return_routed_experts = true;
    x.routed_experts_start_len = 3;
    x.stream = true;
    x.output_through_sink_only = true;
    return x;
  }
  static std::vector<GenerateReqInput> json() {
    auto text = full();
    text.input_ids.reset();
    text.output_through_sink_only = false; // never in JSON: the server's call actors set it
    auto ids = text;
    ids.input_ids = full().input_ids;
    ids.text.reset();
    ids.rid.reset();
    return {text, ids};
  }
  // output_through_sink_only: the server's call actors set it; JSON never carries it.
  static std::vector<std::size_t> json_default_only() { return {11}; }
};

template <>
struct samples<TokenizedGenerateReqInput> : simple_samples<TokenizedGenerateReqInput> {
  static TokenizedGenerateReqInput full() {
    TokenizedGenerateReqInput x;
    x.rid = "req-2";
    x.input_text = "Hi";
    x.input_ids = {5, 6};
    x.sampling_params = samples<SamplingParams>::full();
    x.return_logprob = true;
    x.logprob_start_len = 1;
    x.top_logprobs_num = 2;
    x.return_text_in_logprobs = true;
    x.return_routed_experts = true;
    x.routed_experts_start_len = 1;
    x.stream = true;
    x.sampling_seed = 42;
    return x;
  }
};

template <>
struct samples<FinishReason> : simple_samples<FinishReason> {
  static FinishReason full() {
    FinishReason x;
    x.type = "stop";
    x.matched_token = 151643;
    x.matched_str = "</s>";
    x.message = "stopped";
    return x;
  }
  static std::vector<FinishReason> json() {
    auto token = full();
    token.matched_str.reset();
    auto str = full();
    str.matched_token.reset();
    FinishReason abort;
    abort.type = "abort";
    abort.message = "aborted by pause_generation(abort)";
    return {full(), token, str, abort};
  }
};

template <>
struct samples<TopLogprob> : simple_samples<TopLogprob> {
  static TopLogprob full() { return TopLogprob{17, -0.5f, "ab"}; }
};

template <>
struct samples<GenerateReqOutput> : simple_samples<GenerateReqOutput> {
  static GenerateReqOutput full() {
    GenerateReqOutput x;
    x.success = false;
    x.message = "partial";
    x.rid = "req-1";
    x.text = "Hi there";
    x.output_ids = {10, 11, 12};
    x.output_token_logprobs = {-0.125f, -2.5f, -0.3f};
    x.output_top_logprobs = {{{10, -0.125f, "Hi"}, {99, -3.0f, "Ho"}}, {}, {{12, -0.3f, "re"}}};
    x.output_token_texts = {"Hi", " the", "re"};
    // The first prompt entry is NaN (null in JSON) in real replies; a number here keeps the
    // round trip comparable (codec tests check the null).
    x.input_token_ids = {3, 4};
    x.input_token_logprobs = {-9.0f, -0.75f};
    x.input_top_logprobs = {{}, {{4, -0.75f, "x"}, {5, -1.25f, "y"}}};
    x.input_token_texts = {"a", "b"};
    x.routed_experts = std::vector<int32_t>{0, 3, -1, 2, 1, -1};
    x.top_p_token_ids = {10, 40, 11, 12, 13, 7};
    x.top_p_token_counts = std::vector<int32_t>{2, 1, 3};
    x.routed_experts_start_len = 1;
    x.finished = true;
    x.finish_reason = samples<FinishReason>::full();
    x.prompt_tokens = 5;
    x.completion_tokens = 3;
    x.cached_tokens = 2;
    x.spec_verify_ct = 2;
    x.spec_accepted_tokens = 1;
    x.spec_proposed_drafts = 8;
    x.weight_version_start = "v1";
    x.weight_version = "v2";
    x.weight_version_spans = {{"v1", 0}, {"v2", 2}};
    x.sampling_seed = UINT64_MAX - 1;
    return x;
  }
  static GenerateReqOutput sparse() {
    auto x = full();
    x.finish_reason.reset();
    x.output_token_logprobs.clear();
    x.output_top_logprobs.clear();
    x.output_token_texts.clear();
    x.input_token_ids.clear();
    x.input_token_logprobs.clear();
    x.input_top_logprobs.clear();
    x.input_token_texts.clear();
    x.routed_experts.reset();
    x.routed_experts_start_len = 0;
    return x;
  }
  static std::vector<GenerateReqOutput> json() { return {full(), sparse()}; }
};

template <>
struct samples<TokenChunks> : simple_samples<TokenChunks> {
  static TokenChunks full() { return {{samples<GenerateReqOutput>::full(), GenerateReqOutput{}}}; }
};

template <>
struct samples<WeightVersionSpan> : simple_samples<WeightVersionSpan> {
  static WeightVersionSpan full() { return {"v7", 3}; }
};

template <>
struct samples<AbortReq> : simple_samples<AbortReq> {
  static AbortReq full() { return AbortReq{"req-9", true, "paused"}; }
};

template <>
struct samples<AbortReqOutput> : simple_samples<AbortReqOutput> {
  static AbortReqOutput full() { return AbortReqOutput{false, "no such request", 3}; }
};

template <>
struct samples<HostTensor> : simple_samples<HostTensor> {
  static HostTensor full() { return host_tensor(dtype::bf16, {2, 3}, 5); }
  static std::vector<HostTensor> json() {
    return {full(), host_tensor(dtype::i32, {4}, 9), host_tensor(dtype::f64, {}, 1),
            host_tensor(dtype::u8, {3, 0}, 2), host_tensor(dtype::boolean, {5}, 7)};
  }
};

template <>
struct samples<NamedTensor> : simple_samples<NamedTensor> {
  static NamedTensor full() {
    return NamedTensor{"model.layers.0.mlp.gate_proj.weight", samples<HostTensor>::full()};
  }
};

template <>
struct samples<DeviceTensorRef> : simple_samples<DeviceTensorRef> {
  static DeviceTensorRef full() {
    DeviceTensorRef x;
    x.device = 1;
    x.device_uuid = "GPU-4b652ae2-0ec6-7dcb-611e-8bd2e51d9120";
    x.pointer = 0x7f0000001000ull;
    x.ipc_handle = torch_ipc_handle_bytes();
    x.offset = 4096;
    x.nbytes = 8 * 16 * 2;
    x.type = dtype::f16;
    x.shape = {8, 16};
    x.ref_counter_handle = "/torch_504_3285582889_0";
    x.ref_counter_offset = 638;
    x.event_handle = ipc_handle_bytes();
    x.event_sync_required = true;
    return x;
  }
  // JSON: exactly one of pointer / ipc_handle.
  static DeviceTensorRef ipc() {
    auto x = full();
    x.pointer = 0;
    return x;
  }
  static DeviceTensorRef local() {
    auto x = full();
    x.ipc_handle.clear();
    return x;
  }
  static std::vector<DeviceTensorRef> json() { return {ipc(), local()}; }
};

template <>
struct samples<NamedDeviceTensor> : simple_samples<NamedDeviceTensor> {
  static NamedDeviceTensor full() {
    return NamedDeviceTensor{"model.embed_tokens.weight", samples<DeviceTensorRef>::full()};
  }
  static std::vector<NamedDeviceTensor> json() {
    return {NamedDeviceTensor{"a", samples<DeviceTensorRef>::ipc()},
            NamedDeviceTensor{"b", samples<DeviceTensorRef>::local()}};
  }
};

template <>
struct samples<InitWeightsUpdateGroupReqInput> : simple_samples<InitWeightsUpdateGroupReqInput> {
  static InitWeightsUpdateGroupReqInput full() {
    InitWeightsUpdateGroupReqInput x;
    x.master_address = "10.0.0.1";
    x.master_port = 29500;
    x.rank_offset = 1;
    x.world_size = 3;
    x.group_name = "miles-pp_0";
    x.backend = "gloo";
    x.nccl_unique_id = nccl_unique_id_hex();
    x.timeout_s = 30.5;
    return x;
  }
  static std::vector<InitWeightsUpdateGroupReqInput> json() {
    auto both = full();
    both.backend = "nccl";
    auto tcp = both;
    tcp.nccl_unique_id.clear();
    auto uid = both;
    uid.master_address.clear();
    uid.master_port = 0;
    return {both, tcp, uid};
  }
  // rlserve's groups are NCCL only, and "nccl" is the default.
  static std::vector<std::size_t> json_default_only() { return {5}; }
};

template <>
struct samples<InitWeightsUpdateGroupReqOutput> : status_samples<InitWeightsUpdateGroupReqOutput> {};

template <>
struct samples<DestroyWeightsUpdateGroupReqInput>
  : simple_samples<DestroyWeightsUpdateGroupReqInput> {
  static DestroyWeightsUpdateGroupReqInput full() { return {"miles-pp_1"}; }
};

template <>
struct samples<DestroyWeightsUpdateGroupReqOutput>
  : status_samples<DestroyWeightsUpdateGroupReqOutput> {};

template <>
struct samples<UpdateWeightsFromDistributedReqInput>
  : simple_samples<UpdateWeightsFromDistributedReqInput> {
  static UpdateWeightsFromDistributedReqInput full() {
    UpdateWeightsFromDistributedReqInput x;
    x.names = {"model.layers.0.self_attn.q_proj.weight", "model.norm.weight", "lm_head.weight"};
    x.dtypes = {dtype::bf16, dtype::f32, dtype::i32};
    x.shapes = {{4, 8}, {16}, {0, 3}};
    x.group_name = "miles-pp_0";
    x.flush_cache = false;
    x.abort_all_requests = true;
    x.weight_version = "v3";
    x.load_format = "flattened_bucket";
    x.selector = runner_selector::draft;
    x.torch_empty_cache = true;
    x.timeout_s = 30.5;
    x.requester = 7;
    x.received = 5;
    return x;
  }
  // JSON never carries `requester` (the server sets it) or `received` (the scheduler does).
  static UpdateWeightsFromDistributedReqInput from_client() {
    auto x = full();
    x.requester = 0;
    x.received = 0;
    return x;
  }
  static UpdateWeightsFromDistributedReqInput sparse() {
    auto x = from_client();
    x.weight_version.reset();
    x.load_format.reset();
    x.timeout_s.reset();
    return x;
  }
  static std::vector<UpdateWeightsFromDistributedReqInput> json() { return {from_client(), sparse()}; }
  static std::vector<std::size_t> json_default_only() { return {11, 12}; }
};

template <>
struct samples<UpdateWeightsFromDistributedReqOutput>
  : status_samples<UpdateWeightsFromDistributedReqOutput> {};

template <>
struct samples<UpdateWeightsFromTensorReqInput> : simple_samples<UpdateWeightsFromTensorReqInput> {
  static UpdateWeightsFromTensorReqInput full() {
    UpdateWeightsFromTensorReqInput x;
    x.named_tensors = {samples<NamedTensor>::full(),
                       NamedTensor{"model.norm.weight", host_tensor(dtype::f32, {4}, 11)}};
    x.device_tensors = {NamedDeviceTensor{"lm_head.weight", samples<DeviceTensorRef>::ipc()}};
    x.load_format = "direct";
    x.flush_cache = false;
    x.abort_all_requests = true;
    x.weight_version = "v4";
    x.selector = runner_selector::target;
    x.torch_empty_cache = true;
    x.requester = 7;
    return x;
  }
  // JSON never carries `requester` (the server sets it).
  static UpdateWeightsFromTensorReqInput from_client() {
    auto x = full();
    x.requester = 0;
    return x;
  }
  static UpdateWeightsFromTensorReqInput sparse() {
    auto x = from_client();
    x.load_format.reset();
    x.weight_version.reset();
    return x;
  }
  static std::vector<UpdateWeightsFromTensorReqInput> json() { return {from_client(), sparse()}; }
  static std::vector<std::size_t> json_default_only() { return {8}; }
};

template <>
struct samples<UpdateWeightsFromTensorReqOutput>
  : status_samples<UpdateWeightsFromTensorReqOutput> {};

template <>
struct samples<UpdateWeightFromDiskReqInput> : simple_samples<UpdateWeightFromDiskReqInput> {
  static UpdateWeightFromDiskReqInput full() {
    UpdateWeightFromDiskReqInput x;
    x.model_path = "/ckpt/step-100";
    x.load_format = "safetensors";
    x.abort_all_requests = true;
    x.weight_version = "v5";
    x.is_async = true;
    x.torch_empty_cache = true;
    x.keep_pause = true;
    x.recapture_cuda_graph = true;
    x.token_step = 100;
    x.flush_cache = false;
    x.selector = runner_selector::draft;
    return x;
  }
  static UpdateWeightFromDiskReqInput sparse() {
    auto x = full();
    x.load_format.reset();
    x.weight_version.reset();
    return x;
  }
  static std::vector<UpdateWeightFromDiskReqInput> json() { return {full(), sparse()}; }
};

template <>
struct samples<UpdateWeightFromDiskReqOutput> : simple_samples<UpdateWeightFromDiskReqOutput> {
  static UpdateWeightFromDiskReqOutput full() { return {false, "bad checkpoint", 2}; }
};

template <>
struct samples<BeginWeightUpdateReqInput> : simple_samples<BeginWeightUpdateReqInput> {
  static BeginWeightUpdateReqInput full() { return {runner_selector::target, 7}; }
  static std::vector<BeginWeightUpdateReqInput> json() { return {{runner_selector::target}}; }
  static std::vector<std::size_t> json_default_only() { return {1}; }
};

template <>
struct samples<BeginWeightUpdateReqOutput> : status_samples<BeginWeightUpdateReqOutput> {};

template <>
struct samples<EndWeightUpdateReqInput> : simple_samples<EndWeightUpdateReqInput> {
  static EndWeightUpdateReqInput full() { return {"v6", true, 7}; }
  // JSON never carries `requester` (the server sets it).
  static std::vector<EndWeightUpdateReqInput> json() {
    return {EndWeightUpdateReqInput{"v6", true}, EndWeightUpdateReqInput{std::nullopt, true}};
  }
  static std::vector<std::size_t> json_default_only() { return {2}; }
};

template <>
struct samples<EndWeightUpdateReqOutput> : simple_samples<EndWeightUpdateReqOutput> {
  static EndWeightUpdateReqOutput full() { return {false, "nothing staged", "v6", true}; }
};

template <>
struct samples<PostProcessWeightsReqInput> : simple_samples<PostProcessWeightsReqInput> {
  static PostProcessWeightsReqInput full() { return {true, true, runner_selector::draft}; }
};

template <>
struct samples<PostProcessWeightsReqOutput> : status_samples<PostProcessWeightsReqOutput> {};

template <>
struct samples<UpdateWeightVersionReqInput> : simple_samples<UpdateWeightVersionReqInput> {
  static UpdateWeightVersionReqInput full() { return {"v7", true}; }
};

template <>
struct samples<UpdateWeightVersionReqOutput> : simple_samples<UpdateWeightVersionReqOutput> {
  static UpdateWeightVersionReqOutput full() { return {false, "session open", "v7"}; }
};

template <>
struct samples<CheckWeightsReqInput> : simple_samples<CheckWeightsReqInput> {
  static CheckWeightsReqInput full() {
    return {check_weights_action::reset_tensors, true, {"rotary_emb", "_weight_fp32"},
            runner_selector::draft};
  }
};

template <>
struct samples<ParallelismInfo> : simple_samples<ParallelismInfo> {
  static ParallelismInfo full() { return {1, 2, 1, 2, 1, 2, 3, 8, "draft"}; }
};

template <>
struct samples<ChecksumInfo> : simple_samples<ChecksumInfo> {
  static ChecksumInfo full() {
    ChecksumInfo x;
    x.checksums = {{"model.norm.weight", "0123456789abcdef"},
                   {"draft.model.norm.weight", "fedcba9876543210"}};
    x.role_checksums = {{"target", "00000000deadbeef"}, {"draft", "11111111deadbeef"}};
    x.per_gpu_checksum = "2222222222222222";
    x.parallelism_info = {samples<ParallelismInfo>::full(), ParallelismInfo{}};
    return x;
  }
};

template <>
struct samples<CheckWeightsReqOutput> : simple_samples<CheckWeightsReqOutput> {
  static CheckWeightsReqOutput full() {
    return {false, "compare found 1 change", {samples<ChecksumInfo>::full()}, "3333333333333333",
            {"a"}, {"b", "c"}};
  }
};

template <>
struct samples<GetWeightsByNameReqInput> : simple_samples<GetWeightsByNameReqInput> {
  static GetWeightsByNameReqInput full() { return {"lm_head.weight", 10, runner_selector::draft}; }
};

template <>
struct samples<GetWeightsByNameReqOutput> : simple_samples<GetWeightsByNameReqOutput> {
  static GetWeightsByNameReqOutput full() {
    return {false, "truncated", {0.5f, -1.25f, 3.0f, 1e-8f}, dtype::bf16, {4, 8}};
  }
};

template <>
struct samples<PauseGenerationReqInput> : simple_samples<PauseGenerationReqInput> {
  static PauseGenerationReqInput full() { return {pause_mode::retract}; }
  static std::vector<PauseGenerationReqInput> json() {
    return {full(), PauseGenerationReqInput{pause_mode::in_place}};
  }
};

template <>
struct samples<PauseGenerationReqOutput> : status_samples<PauseGenerationReqOutput> {};

template <>
struct samples<ContinueGenerationReqInput> : simple_samples<ContinueGenerationReqInput> {
  static ContinueGenerationReqInput full() { return {false}; }
};

template <>
struct samples<ContinueGenerationReqOutput> : status_samples<ContinueGenerationReqOutput> {};

template <>
struct samples<FlushCacheReqInput> : simple_samples<FlushCacheReqInput> {
  static FlushCacheReqInput full() { return {2.5}; }
  static std::vector<FlushCacheReqInput> json() { return {full(), FlushCacheReqInput{}}; }
};

template <>
struct samples<FlushCacheReqOutput> : status_samples<FlushCacheReqOutput> {};

template <>
struct samples<ReleaseMemoryOccupationReqInput> : simple_samples<ReleaseMemoryOccupationReqInput> {
  static ReleaseMemoryOccupationReqInput full() { return {{"weights", "kv_cache"}}; }
  static std::vector<ReleaseMemoryOccupationReqInput> json() {
    return {full(), ReleaseMemoryOccupationReqInput{}, ReleaseMemoryOccupationReqInput{{"cuda_graph"}}};
  }
};

template <>
struct samples<ReleaseMemoryOccupationReqOutput> : status_samples<ReleaseMemoryOccupationReqOutput> {};

template <>
struct samples<ResumeMemoryOccupationReqInput> : simple_samples<ResumeMemoryOccupationReqInput> {
  static ResumeMemoryOccupationReqInput full() { return {{"weights"}}; }
  static std::vector<ResumeMemoryOccupationReqInput> json() { return {full(), ResumeMemoryOccupationReqInput{}}; }
};

template <>
struct samples<ResumeMemoryOccupationReqOutput> : status_samples<ResumeMemoryOccupationReqOutput> {};

template <>
struct samples<GetServerInfoReqInput> : simple_samples<GetServerInfoReqInput> {
  static GetServerInfoReqInput full() { return {}; }
};

template <>
struct samples<GetServerInfoReqOutput> : simple_samples<GetServerInfoReqOutput> {
  static GetServerInfoReqOutput full() {
    GetServerInfoReqOutput x;
    x.success = false;
    x.message = "m";
    x.model_path = "/models/qwen3";
    x.draft_model_path = "/models/qwen3-draft";
    x.weight_version = "v9";
    x.device = "cuda:0 (NVIDIA H200)";
    x.architecture = "Qwen3MoeForCausalLM";
    x.vocab_size = 151936;
    x.max_context_length = 40960;
    x.paused = true;
    x.pause_mode = "in_place";
    x.weight_update_session_open = true;
    x.scheduler_steps = 1234;
    x.scheduler_cpu_us = 5678.5;
    x.speculative_num_draft_tokens = 4;
    x.spec_verify_steps = 10;
    x.spec_accepted_tokens = 17;
    x.spec_proposed_drafts = 40;
    x.spec_accept_rate = 0.425;
    x.spec_accept_length = 2.7;
    x.spec_recent_accept_length = 2.5;
    x.running_requests = 3;
    x.waiting_requests = 4;
    x.committed_updates = UINT64_MAX;
    x.weight_transports = {"inline", "disk", "cuda_ipc"};
    x.int4_modules = 96;
    x.int4_update_recipe = "int4-asym g128";
    x.int4_quantized_on = "device";
    x.max_running_requests = 64;
    x.max_total_num_tokens = 65536;
    x.num_used_tokens = 1024;
    x.prefix_cache = true;
    x.prefix_cached_tokens = 4096;
    x.prefix_query_tokens = 20000;
    x.prefix_hit_tokens = 15000;
    x.prefill_tokens = 5000;
    return x;
  }
};

template <>
struct samples<HealthCheckReqInput> : simple_samples<HealthCheckReqInput> {
  static HealthCheckReqInput full() { return {}; }
};

template <>
struct samples<HealthCheckReqOutput> : status_samples<HealthCheckReqOutput> {};

template <>
struct samples<SequenceWork> : simple_samples<SequenceWork> {
  static SequenceWork full() {
    return {true, {4, 9}, 32, 3, 17, {1, 2}, false, samples<SamplingParams>::full(), 9, {6, 6}, 3, {5}, true, true, 4,
            {7, 8}, {0.25f, 0.75f}, true};
  }
};

template <>
struct samples<ForwardBatch> : simple_samples<ForwardBatch> {
  static ForwardBatch full() {
    return {11, {5, 6, 3, 4}, {samples<SequenceWork>::full(), SequenceWork{}}, {100, 101}};
  }
};

template <>
struct samples<WorkResult> : simple_samples<WorkResult> {
  static WorkResult full() {
    return {{42}, {-0.3f}, {8, 9}, {0.5f, 0.5f}, true, {{{42, -0.3f}, {43, -1.0f}}, {}}, {-2.0f},
            {{{1, -2.0f}}}, {3, 1, -1, -1}, {42, 7, 3}, {3}};
  }
};

template <>
struct samples<ForwardBatchOutput> : simple_samples<ForwardBatchOutput> {
  static ForwardBatchOutput full() {
    return {false, "oom", 11, {7, 9, -1}, {-1.5f, -0.5f, 0.0f}, {"", "", "sequence 4 is unknown"},
            {samples<WorkResult>::full()}};
  }
};

template <>
struct samples<ReleaseSequences> : simple_samples<ReleaseSequences> {
  static ReleaseSequences full() { return {{5, 6, UINT64_MAX}}; }
};

template <>
struct samples<TensorSpec> : simple_samples<TensorSpec> {
  static TensorSpec full() { return {"w", dtype::bf16, {2, 3}}; }
};

template <>
struct samples<RunnerManifest> : simple_samples<RunnerManifest> {
  static RunnerManifest full() {
    RunnerManifest x;
    x.role = "draft";
    x.tp_rank = 1;
    x.tp_size = 2;
    x.model_path = "/models/draft";
    x.architecture = "Qwen3ForCausalLM";
    x.device = "cuda:1";
    x.vocab_size = 151936;
    x.max_context_length = 32768;
    x.eos_token_ids = {151643, 151645};
    x.kv_block_size = 16;
    x.kv_num_blocks = 4096;
    x.parameters = {samples<TensorSpec>::full(), TensorSpec{"v", dtype::i32, {7}}};
    x.aliases = {TensorAlias{"lm_head.weight", "model.embed_tokens.weight"}};
    x.capabilities = {true, false, true, 96, "int4-asym g128", "device"};
    return x;
  }
};

template <>
struct samples<StageTensors> : simple_samples<StageTensors> {
  static StageTensors full() {
    return {{samples<NamedTensor>::full(),
             NamedTensor{"scalar", host_tensor(dtype::f64, {}, 3)},
             NamedTensor{"empty", host_tensor(dtype::i8, {0}, 0)}}};
  }
};

template <>
struct samples<StageDeviceTensors> : simple_samples<StageDeviceTensors> {
  static StageDeviceTensors full() { return {samples<NamedDeviceTensor>::json()}; }
};

template <>
struct samples<JoinWeightGroup> : simple_samples<JoinWeightGroup> {
  static JoinWeightGroup full() { return {samples<InitWeightsUpdateGroupReqInput>::full(), 3, 2}; }
};

template <>
struct samples<ReceiveBroadcast> : simple_samples<ReceiveBroadcast> {
  static ReceiveBroadcast full() {
    return {{samples<TensorSpec>::full(), TensorSpec{"v", dtype::i32, {7}}}, true, 12.5, false};
  }
};

template <>
struct samples<ReceivedBroadcast> : simple_samples<ReceivedBroadcast> {
  static ReceivedBroadcast full() {
    return {false, "m", 9, {samples<NamedDeviceTensor>::full()}, true};
  }
};

template <>
struct samples<ReleaseBroadcast> : simple_samples<ReleaseBroadcast> {
  static ReleaseBroadcast full() { return {77}; }
};

template <>
struct samples<RunnerReply> : simple_samples<RunnerReply> {
  static RunnerReply full() { return {false, "it failed: \"why\"\n", true}; }
};

template <>
struct samples<RunnerCheckOutput> : simple_samples<RunnerCheckOutput> {
  static RunnerCheckOutput full() {
    return {false, "m", "draft", {"a", "b"}, {123, UINT64_MAX}, {"b"}, {"c"}};
  }
};

template <>
struct samples<WeightUpdaterStatus> : simple_samples<WeightUpdaterStatus> {
  static WeightUpdaterStatus full() { return {"v8", true, "draft", 12}; }
};

} // namespace rlserve_test
