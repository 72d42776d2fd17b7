// DeviceFailure::describe: turns what the waiting block recorded into a diagnosis.
#include "swiftqk/device_failure.hpp"

#include <sstream>

namespace swiftqk {

std::string DeviceFailure::describe() const {
  if (code == 0) return "no failure";
  std::ostringstream s;
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
