// DeviceFailure::describe: turns what the waiting block recorded into a diagnosis.
#include "swiftqk/device_failure.hpp"

#include <sstream>

namespace swiftqk {

std::string DeviceFailure::describe() const {
  if (code == 0) return "no failure";
  std::ostringstream s;
  if (code == 2) {
    s << "rank " << rank
      << " found a second kernel of its communicator running at the same time (launches on two "
         "streams, or CUDA-graph replays on two streams, without ordering them); one call at a "
         "time per communicator. Every rank must call reset()";
    return s.str();
  }
  if (code == 3) {
    s << "rank " << rank << " stopped because rank " << peer
      << " of its group recorded a failure (that rank's error names the cause); its outputs "
         "are NaN until every rank has called reset()";
    return s.str();
  }
  if (code == 4 || code == 5) {
    s << "rank " << rank << ": epilogue token " << token << " has "
      << (code == 4 ? "position " : "KV-cache slot ") << value << ", outside [0, " << limit << ") "
      << (code == 4 ? "(max_position of the cos/sin cache)"
                    : "(num_blocks x block_size) and not -1")
      << "; nothing of that token was written (its Q output row is NaN)";
    return s.str();
  }
  if (code == 6) {
    s << "rank " << rank << ": the NCCL all-reduce of the partial sums of tokens from " << token
      << " (this group has no P2P, so it exchanges through NCCL) did not finish within "
         "CommConfig::timeout_s: a rank did not make the same call, or is late. The fallback's "
         "NCCL communicator was aborted, and this call's outputs are NaN; every rank must call "
         "reset(), which makes a new one";
    return s.str();
  }
  if (code == 7) {
    s << "rank " << rank
      << ": the ranks of this group made a call with different configurations (full widths, "
         "TP degree, eps, norm order, input dtype or token count; this group has no P2P, so "
         "it exchanges through NCCL, and its all-reduce carries a check of them). This call's "
         "outputs are NaN; every rank must call reset()";
    return s.str();
  }
  if (code == 8) {
    s << "rank " << rank
      << ": reset() did not finish: this group has no P2P, so it exchanges through NCCL, and "
         "reset() aborted the fallback's NCCL communicator but could not split a new one "
         "(reset()'s error says why). Calls on this rank have nothing to all-reduce on: their "
         "outputs are NaN; reset() failed and must be called again on every rank";
    return s.str();
  }
  if (code == 1 && token < 0) {
    s << "rank " << rank
      << " timed out waiting for its own kernel's first block to claim the rank: the grid could "
         "not become resident (other work holds the SMs; leave room with CommConfig::sm_budget)";
    return s.str();
  }
  if (code != 1) {
    s << "rank " << rank << " recorded an unknown failure code " << code;
    return s.str();
  }
  s << "rank " << rank << " timed out waiting for rank " << peer << "'s partial sums of token "
    << token;
  if (expected_tag == 0) {  // the MiniMax-fused exchange carries no tags
    s << ": rank " << peer << " did not make the same call or its writes never arrive";
  } else if (seen_tag == 0) {
    s << " (expected tag " << expected_tag << ", found nothing): rank " << peer
      << " did not make this call (missing, or fewer calls than this rank) or its writes never "
         "arrive";
  } else if (seen_tag == expected_tag) {
    s << " (found this call's tag " << expected_tag << " with another configuration hash): rank "
      << peer
      << " made this call with other full widths, world size, eps, norm order or token count";
  } else {
    // Tags are the call number + 1 (tag_for_call), so the slot names the call that wrote it.
    s << " (expected tag " << expected_tag << ", found tag " << seen_tag
      << ", left by an earlier call): rank " << peer
      << " did not make this call (missing, or its call sequence differs from this rank's) or "
         "its writes never arrive";
  }
  return s.str();
}

}  // namespace swiftqk
