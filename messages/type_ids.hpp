// The ONLY CAF type-ID block of rlserve: every message struct that travels between actors (on
// its own, not only as a field of another) and every atom. CAF 0.17.6 as built by Debian does
// not check type IDs, so a type missing here works locally and fails only across processes or
// on migration; tests/messages/roundtrip_test.cpp serializes every listed type.
#pragma once

#include <cstdint>

#include "caf/type_id.hpp"
#include "messages/operations.hpp"

namespace rlserve {
#define RLSERVE_DECLARE_OPERATION(route, method, In, Out, auth, role) \
  struct In;                                                          \
  struct Out;
RLSERVE_CONTROL_OPERATIONS(RLSERVE_DECLARE_OPERATION, RLSERVE_OP_NOTHING)
RLSERVE_WEIGHT_OPERATIONS(RLSERVE_DECLARE_OPERATION, RLSERVE_OP_NOTHING)
#undef RLSERVE_DECLARE_OPERATION
struct SamplingParams;
struct GenerateReqInput;
struct TokenizedGenerateReqInput;
struct GenerateReqOutput;
struct TokenChunks;
struct HostTensor;
struct NamedTensor;
struct DeviceTensorRef;
struct ForwardBatch;
struct ForwardBatchOutput;
struct ReleaseSequences;
struct RunnerManifest;
struct StageTensors;
struct StageDeviceTensors;
struct RunnerReply;
struct JoinWeightGroup;
struct ReceiveBroadcast;
struct ReceivedBroadcast;
struct ReleaseBroadcast;
struct RunnerCheckOutput;
struct WeightUpdaterStatus;
} // namespace rlserve

CAF_BEGIN_TYPE_ID_BLOCK(rlserve, caf::first_custom_type_id)

  // generate (messages/generate.hpp)
  CAF_ADD_TYPE_ID(rlserve, (rlserve::SamplingParams))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::GenerateReqInput))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::TokenizedGenerateReqInput))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::GenerateReqOutput))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::TokenChunks))

  // tensors (messages/tensor.hpp)
  CAF_ADD_TYPE_ID(rlserve, (rlserve::HostTensor))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::NamedTensor))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::DeviceTensorRef))

  // the operations of messages/operations.hpp: request and reply of each
#define RLSERVE_OPERATION_TYPE_IDS(route, method, In, Out, auth, role) \
  CAF_ADD_TYPE_ID(rlserve, (rlserve::In))                               \
  CAF_ADD_TYPE_ID(rlserve, (rlserve::Out))
  RLSERVE_CONTROL_OPERATIONS(RLSERVE_OPERATION_TYPE_IDS, RLSERVE_OP_NOTHING)
  RLSERVE_WEIGHT_OPERATIONS(RLSERVE_OPERATION_TYPE_IDS, RLSERVE_OP_NOTHING)
#undef RLSERVE_OPERATION_TYPE_IDS

  // runner (messages/runner.hpp, internal)
  CAF_ADD_TYPE_ID(rlserve, (rlserve::ForwardBatch))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::ForwardBatchOutput))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::ReleaseSequences))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::RunnerManifest))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::StageTensors))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::StageDeviceTensors))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::RunnerReply))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::JoinWeightGroup))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::ReceiveBroadcast))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::ReceivedBroadcast))
  CAF_ADD_TYPE_ID(rlserve, (rlserve::ReleaseBroadcast))
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
  CAF_ADD_ATOM(rlserve, rlserve, cancel_atom, "cancel")     // front door: abort an own request
  CAF_ADD_ATOM(rlserve, rlserve, poll_atom, "poll")         // weight_group: look for the NCCL id
  CAF_ADD_ATOM(rlserve, rlserve, receive_atom, "receive")   // updater: receive an NCCL update

CAF_END_TYPE_ID_BLOCK(rlserve)
