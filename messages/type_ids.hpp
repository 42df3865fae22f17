// The ONLY CAF type-ID block of rlserve: every message struct that travels between actors (on
// its own, not only as a field of another) and every atom. CAF 0.17.6 as built by Debian does
// not check type IDs, so a type missing here works locally and fails only across processes or
// on migration; tests/messages/roundtrip_test.cpp serializes every listed type.
#pragma once

#include <cstdint>

#include "caf/type_id.hpp"

namespace rlserve {
struct SamplingParams;
struct GenerateReqInput;
struct TokenizedGenerateReqInput;
struct GenerateReqOutput;
struct TokenChunk;
struct TokenChunks;
struct AbortReq;
struct AbortReqOutput;
struct HostTensor;
struct NamedTensor;
struct DeviceTensorRef;
struct InitWeightsUpdateGroupReqInput;
struct InitWeightsUpdateGroupReqOutput;
struct DestroyWeightsUpdateGroupReqInput;
struct DestroyWeightsUpdateGroupReqOutput;
struct UpdateWeightsFromDistributedReqInput;
struct UpdateWeightsFromDistributedReqOutput;
struct UpdateWeightsFromTensorReqInput;
struct UpdateWeightsFromTensorReqOutput;
struct UpdateWeightFromDiskReqInput;
struct UpdateWeightFromDiskReqOutput;
struct BeginWeightUpdateReqInput;
struct BeginWeightUpdateReqOutput;
struct EndWeightUpdateReqInput;
struct EndWeightUpdateReqOutput;
struct PostProcessWeightsReqInput;
struct PostProcessWeightsReqOutput;
struct UpdateWeightVersionReqInput;
struct UpdateWeightVersionReqOutput;
struct CheckWeightsReqInput;
struct CheckWeightsReqOutput;
struct GetWeightsByNameReqInput;
struct GetWeightsByNameReqOutput;
struct PauseGenerationReqInput;
struct PauseGenerationReqOutput;
struct ContinueGenerationReqInput;
struct ContinueGenerationReqOutput;
struct FlushCacheReqInput;
struct FlushCacheReqOutput;
struct GetServerInfoReqInput;
struct GetServerInfoReqOutput;
struct HealthCheckReqInput;
struct HealthCheckReqOutput;
struct ForwardBatch;
struct ForwardBatchOutput;
struct ReleaseSequences;
struct RunnerManifest;
struct StageTensors;
struct StageDeviceTensors;
struct RunnerReply;
struct RunnerCheckOutput;
struct WeightUpdaterStatus;
} // namespace rlserve

CAF_BEGIN_TYPE_ID_BLOCK(rlserve, caf::first_custom_type_id)

  // generate (messages/generate.hpp)
  CAF_ADD_TYPE_ID(rlserve, (rlserve::SamplingParams))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::GenerateReqInput))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::TokenizedGenerateReqInput))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::GenerateReqOutput))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::TokenChunk))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::TokenChunks))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::AbortReq))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::AbortReqOutput))

  // tensors (messages/tensor.hpp)
  CAF_ADD_TYPE_ID(rlserve, (rlserve::HostTensor))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::NamedTensor))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::DeviceTensorRef))

  // weight update (messages/weight_update.hpp)
  CAF_ADD_TYPE_ID(rlserve, (rlserve::InitWeightsUpdateGroupReqInput))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::InitWeightsUpdateGroupReqOutput))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::DestroyWeightsUpdateGroupReqInput))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::DestroyWeightsUpdateGroupReqOutput))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::UpdateWeightsFromDistributedReqInput))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::UpdateWeightsFromDistributedReqOutput))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::UpdateWeightsFromTensorReqInput))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::UpdateWeightsFromTensorReqOutput))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::UpdateWeightFromDiskReqInput))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::UpdateWeightFromDiskReqOutput))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::BeginWeightUpdateReqInput))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::BeginWeightUpdateReqOutput))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::EndWeightUpdateReqInput))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::EndWeightUpdateReqOutput))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::PostProcessWeightsReqInput))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::PostProcessWeightsReqOutput))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::UpdateWeightVersionReqInput))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::UpdateWeightVersionReqOutput))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::CheckWeightsReqInput))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::CheckWeightsReqOutput))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::GetWeightsByNameReqInput))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::GetWeightsByNameReqOutput))

  // control (messages/control.hpp)
  CAF_ADD_TYPE_ID(rlserve, (rlserve::PauseGenerationReqInput))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::PauseGenerationReqOutput))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::ContinueGenerationReqInput))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::ContinueGenerationReqOutput))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::FlushCacheReqInput))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::FlushCacheReqOutput))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::GetServerInfoReqInput))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::GetServerInfoReqOutput))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::HealthCheckReqInput))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::HealthCheckReqOutput))

  // runner (messages/runner.hpp, internal)
  CAF_ADD_TYPE_ID(rlserve, (rlserve::ForwardBatch))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::ForwardBatchOutput))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::ReleaseSequences))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::RunnerManifest))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::StageTensors))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::StageDeviceTensors))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::RunnerReply))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::RunnerCheckOutput))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::WeightUpdaterStatus))

  // atoms (<= 10 characters)
  CAF_ADD_ATOM(rlserve, rlserve, restore_atom, "restore")   // runner: begin a session
  CAF_ADD_ATOM(rlserve, rlserve, commit_atom, "commit")     // runner: swap staged weights in
  CAF_ADD_ATOM(rlserve, rlserve, discard_atom, "discard")   // runner: drop staged weights
  CAF_ADD_ATOM(rlserve, rlserve, settle_atom, "settle")     // updater: commit an implicit session
  CAF_ADD_ATOM(rlserve, rlserve, manifest_atom, "manifest") // runner: describe yourself
  CAF_ADD_ATOM(rlserve, rlserve, step_atom, "step")         // scheduler: run one batch
  CAF_ADD_ATOM(rlserve, rlserve, version_atom, "version")   // weight version queries/updates
  CAF_ADD_ATOM(rlserve, rlserve, stats_atom, "stats")       // scheduler: queue depths

CAF_END_TYPE_ID_BLOCK(rlserve)
