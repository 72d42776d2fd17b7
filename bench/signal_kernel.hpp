// The latency floor of any cross-GPU exchange: a flag written into a peer GPU's memory and
// answered back, measured on the device over many rounds.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace swiftqk::bench {

/// One rank's side of a ping-pong over CUDA peer memory. `mine` is this rank's flag word
/// (zeroed before), `peer` the partner's flag word as mapped here (IPC or peer access). The
/// initiator writes round i into the peer and waits for i back; the responder waits for i and
/// writes it back. Returns the initiator's mean round trip in microseconds over `rounds` rounds
/// after `warmup` untimed ones (device timer, so launch skew between the ranks does not count);
/// the responder returns 0. Throws if a wait exceeds timeout_s (the partner never answered).
double ping_pong_us(uint32_t* mine, uint32_t* peer, bool initiator, int warmup, int rounds,
                    double timeout_s, cudaStream_t stream);

}  // namespace swiftqk::bench
