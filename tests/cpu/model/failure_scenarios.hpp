// What the failure model's scenarios (test_failure_model_*.cpp) share: the calls they make, the
// launch ids of kernels that run at once, the collective resets and eager call sequences of
// every rank, and the checks on a communicator's rows and state.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "failure_model.hpp"

namespace swiftqk::model::failure {

// Launch ids of kernels of one rank that run at once, n-th triple: distinct in their low 16 bits,
// which is what the owner id keeps (OwnerId), and above every id the communicator draws itself
// in these tests.
constexpr uint32_t id_a(int n) { return 0x8000u + 3u * static_cast<uint32_t>(n); }
constexpr uint32_t id_b(int n) { return id_a(n) + 1u; }
constexpr uint32_t id_c(int n) { return id_a(n) + 2u; }

// Four tokens over two blocks, waits that expire after kFailDeadline.
Call FailingCall(int data = 0);
Call ReplayOf(Call c);

// The rows of kernels, each joined first.
Rows CheckAll(const Comm& c, const std::vector<std::shared_ptr<Kernel>>& kernels);

// Every rank resets at once, each from its own host thread.
std::vector<ResetOutcome> ResetAll(Comm& c, Ms barrier_deadline = kBarrierDeadline);

// Nothing recorded, nothing owned, nothing counted: the state of a healthy, idle rank.
void ExpectIdleAndHealthy(const Comm& c, uint32_t call);

// Every rank makes `calls` eager calls of data first_data, first_data + 1, ... Ranks agree on the
// token counts (1..kCapacity) and draw their blocks (1-3) and deferral depths (0-2) per call;
// random delays in the blocks and between calls let them drift apart. A refused launch counts
// its rows as wrong.
Rows RunCalls(Comm& c, int calls, int first_data, uint64_t seed);

}  // namespace swiftqk::model::failure
