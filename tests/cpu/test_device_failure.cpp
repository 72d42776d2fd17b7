// The error text a failed exchange turns into: it names the ranks and the token, and reads the
// slot's last contents (nothing, this call's tag with another configuration, an earlier call's
// tag) as the likely cause.
#include <gtest/gtest.h>

#include <string>

#include "protocol.hpp"
#include "swiftqk/device_failure.hpp"

namespace swiftqk {
namespace {

DeviceFailure timeout(uint32_t expected, uint32_t seen) {
  DeviceFailure f;
  f.code = 1;
  f.rank = 2;
  f.peer = 5;
  f.token = 1234;
  f.expected_tag = expected;
  f.seen_tag = seen;
  return f;
}

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(DeviceFailure, NoFailure) { EXPECT_EQ(DeviceFailure{}.describe(), "no failure"); }

TEST(DeviceFailure, AnNcclFallbackConfigurationMismatchNamesWhatMustAgree) {
  DeviceFailure f;
  f.code = 7;
  f.rank = 1;
  const std::string d = f.describe();
  EXPECT_TRUE(has(d, "rank 1")) << d;
  for (const char* what : {"full widths", "eps", "norm order", "input dtype", "token count",
                           "outputs are NaN", "reset()"}) {
    EXPECT_TRUE(has(d, what)) << what << ": " << d;
  }
}

TEST(DeviceFailure, AnNcclFallbackTimeoutNamesTheRankTheTokensAndTheWayOut) {
  DeviceFailure f;
  f.code = 6;
  f.rank = 3;
  f.token = 16384;
  const std::string d = f.describe();
  EXPECT_TRUE(has(d, "rank 3")) << d;
  EXPECT_TRUE(has(d, "NCCL all-reduce of the partial sums of tokens from 16384")) << d;
  EXPECT_TRUE(has(d, "timeout_s")) << d;
  EXPECT_TRUE(has(d, "outputs are NaN")) << d;
  EXPECT_TRUE(has(d, "reset()")) << d;
}

TEST(DeviceFailure, AnNcclFallbackResetWhoseSplitFailedSaysToResetAgainOnEveryRank) {
  DeviceFailure f;
  f.code = 8;
  f.rank = 2;
  const std::string d = f.describe();
  EXPECT_TRUE(has(d, "rank 2")) << d;
  EXPECT_FALSE(has(d, "unknown failure code")) << d;
  for (const char* what : {"reset() did not finish", "could not split", "outputs are NaN",
                           "called again on every rank"}) {
    EXPECT_TRUE(has(d, what)) << what << ": " << d;
  }
}

TEST(DeviceFailure, EveryTimeoutNamesTheRanksAndTheToken) {
  for (const auto& [expected, seen] :
       {std::pair{tag_for_call(7), 0u}, std::pair{tag_for_call(7), tag_for_call(7)},
        std::pair{tag_for_call(7), tag_for_call(5)}, std::pair{0u, 0u}}) {
    const std::string d = timeout(expected, seen).describe();
    EXPECT_TRUE(has(d, "rank 2 timed out waiting for rank 5")) << d;
    EXPECT_TRUE(has(d, "token 1234")) << d;
  }
}

TEST(DeviceFailure, AnEmptySlotMeansThePeerDidNotCall) {
  const std::string d = timeout(tag_for_call(7), 0).describe();
  EXPECT_TRUE(has(d, "found nothing")) << d;
  EXPECT_TRUE(has(d, "did not make this call")) << d;
}

TEST(DeviceFailure, ThisCallsTagWithAnotherHashMeansAnotherConfiguration) {
  const std::string d = timeout(tag_for_call(7), tag_for_call(7)).describe();
  EXPECT_TRUE(has(d, "another configuration hash")) << d;
  EXPECT_TRUE(has(d, "token count")) << d;
  EXPECT_FALSE(has(d, "did not make this call")) << d;
}

TEST(DeviceFailure, AnEarlierCallsTagMeansTheSequencesDiffer) {
  const std::string d = timeout(tag_for_call(7), tag_for_call(5)).describe();
  EXPECT_TRUE(has(d, "found tag " + std::to_string(tag_for_call(5)))) << d;
  EXPECT_TRUE(has(d, "earlier call")) << d;
}

TEST(DeviceFailure, TheUntaggedMiniMaxExchangeSaysNoTag) {
  const std::string d = timeout(0, 0).describe();
  EXPECT_FALSE(has(d, "tag")) << d;
  EXPECT_TRUE(has(d, "did not make the same call")) << d;
}

}  // namespace
}  // namespace swiftqk

namespace swiftqk {
namespace {

TEST(DeviceFailure, ASecondKernelIsNamedAsSuch) {
  DeviceFailure f;
  f.code = 2;
  f.rank = 3;
  const std::string d = f.describe();
  EXPECT_NE(d.find("rank 3 found a second kernel"), std::string::npos) << d;
  EXPECT_NE(d.find("reset()"), std::string::npos) << d;
}

TEST(DeviceFailure, APeersFailureNamesThePeer) {
  DeviceFailure f;
  f.code = 3;
  f.rank = 1;
  f.peer = 0;
  const std::string d = f.describe();
  EXPECT_NE(d.find("rank 1 stopped because rank 0"), std::string::npos) << d;
  EXPECT_NE(d.find("NaN"), std::string::npos) << d;
}

// A block that waited in vain for its own kernel's first block to claim the rank records a
// timeout without a token: the cause is residency, not a peer.
TEST(DeviceFailure, AGridThatNeverBecameResidentSaysSo) {
  DeviceFailure f;
  f.code = 1;
  f.rank = 2;
  f.peer = 2;
  f.token = -1;
  const std::string d = f.describe();
  EXPECT_NE(d.find("rank 2 timed out waiting for its own kernel's first block"), std::string::npos)
      << d;
  EXPECT_NE(d.find("sm_budget"), std::string::npos) << d;
}

TEST(DeviceFailure, AnUnknownCodeIsNotTakenForATimeout) {
  DeviceFailure f;
  f.code = 9;
  f.rank = 2;
  const std::string d = f.describe();
  EXPECT_NE(d.find("unknown failure code 9"), std::string::npos) << d;
  EXPECT_EQ(d.find("timed out"), std::string::npos) << d;
}

}  // namespace
}  // namespace swiftqk

namespace swiftqk {
namespace {

DeviceFailure bad_input(uint32_t code, int64_t value, int64_t limit) {
  DeviceFailure f;
  f.code = code;
  f.rank = 3;
  f.token = 17;
  f.value = value;
  f.limit = limit;
  return f;
}

TEST(DeviceFailure, ABadPositionNamesTheTokenTheValueAndTheBound) {
  const std::string d = bad_input(4, 8192, 4096).describe();
  EXPECT_NE(d.find("rank 3: epilogue token 17 has position 8192, outside [0, 4096)"),
            std::string::npos)
      << d;
  EXPECT_NE(d.find("max_position"), std::string::npos) << d;
  EXPECT_NE(d.find("its Q output row is NaN"), std::string::npos) << d;
  EXPECT_EQ(d.find("timed out"), std::string::npos) << d;
  // A negative position is named as such, not as a huge unsigned value.
  const std::string n = bad_input(4, -2, 4096).describe();
  EXPECT_NE(n.find("position -2, outside [0, 4096)"), std::string::npos) << n;
}

TEST(DeviceFailure, ABadSlotNamesTheTokenTheValueAndTheBound) {
  const std::string d = bad_input(5, -7, 16 * 1024).describe();
  EXPECT_NE(d.find("rank 3: epilogue token 17 has KV-cache slot -7, outside [0, 16384)"),
            std::string::npos)
      << d;
  EXPECT_NE(d.find("num_blocks x block_size"), std::string::npos) << d;
  EXPECT_NE(d.find("not -1"), std::string::npos) << d;
  EXPECT_NE(d.find("nothing of that token was written"), std::string::npos) << d;
  EXPECT_EQ(d.find("position"), std::string::npos) << d;
}

}  // namespace
}  // namespace swiftqk
