// Tests for call tags, banks and the configuration hash: tags never zero and distinct across
// the counter's wrap, banks alternating, k tags never zero nor a plain tag.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "swiftqk/plan.hpp"

namespace swiftqk {
namespace {

TEST(CallTags, NeverZeroAndWrapsAt2To30) {
  for (uint32_t c = 0; c < (1u << 16); ++c) ASSERT_NE(tag_for_call(c), 0u) << c;
  for (uint32_t c = 0x3fff0000u; c <= 0x3fffffffu; ++c) ASSERT_NE(tag_for_call(c), 0u) << c;
  // Any 32-bit counter value (the counter is kept below 2^30, but the tag masks anyway).
  for (uint64_t c = 0; c <= 0xffffffffull; c += 0x10001ull) {
    ASSERT_NE(tag_for_call(static_cast<uint32_t>(c)), 0u) << c;
    ASSERT_LE(tag_for_call(static_cast<uint32_t>(c)), 1u << 30) << c;
  }
  EXPECT_EQ(tag_for_call(0), 1u);
  EXPECT_EQ(tag_for_call(0x3fffffffu), 0x40000000u);
  EXPECT_EQ(next_call(0x3fffffffu), 0u);
  EXPECT_EQ(next_call(0), 1u);
}

TEST(CallTags, BankAlternatesAndTagsDifferAcrossTheWrap) {
  for (uint32_t start : {0u, 1u, 12345u, 0x3ffffff0u, 0x3ffffffdu, 0x3ffffffeu, 0x3fffffffu}) {
    uint32_t c = start;
    for (int i = 0; i < 16; ++i) {
      const uint32_t c1 = next_call(c), c2 = next_call(c1);
      SCOPED_TRACE("call " + std::to_string(c));
      EXPECT_LT(c1, 1u << 30);
      EXPECT_NE(bank_for_call(c), bank_for_call(c1));
      EXPECT_EQ(bank_for_call(c), bank_for_call(c2));
      EXPECT_NE(tag_for_call(c), tag_for_call(c1));
      EXPECT_NE(tag_for_call(c1), tag_for_call(c2));
      EXPECT_NE(tag_for_call(c), tag_for_call(c2));
      c = c1;
    }
  }
  // Walk through the wrap explicitly.
  uint32_t c = 0x3ffffffdu;
  std::vector<uint32_t> seen;
  for (int i = 0; i < 6; ++i) {
    seen.push_back(c);
    c = next_call(c);
  }
  EXPECT_EQ(seen, (std::vector<uint32_t>{0x3ffffffdu, 0x3ffffffeu, 0x3fffffffu, 0u, 1u, 2u}));
  for (std::size_t i = 1; i < seen.size(); ++i) {
    EXPECT_NE(bank_for_call(seen[i]), bank_for_call(seen[i - 1])) << i;
  }
}

TEST(ConfigHash, TopBitSetDeterministicAndSensitive) {
  const uint32_t h = config_hash(4096, 1024, 2, 1e-6f, 0, 64);
  EXPECT_EQ(h & 0x80000000u, 0x80000000u);
  EXPECT_EQ(h, config_hash(4096, 1024, 2, 1e-6f, 0, 64));
  EXPECT_NE(h, config_hash(4096 + 2, 1024, 2, 1e-6f, 0, 64));
  EXPECT_NE(h, config_hash(5120, 1024, 2, 1e-6f, 0, 64));
  EXPECT_NE(h, config_hash(4096, 1024 + 2, 2, 1e-6f, 0, 64));
  EXPECT_NE(h, config_hash(4096, 512, 2, 1e-6f, 0, 64));
  EXPECT_NE(h, config_hash(1024, 4096, 2, 1e-6f, 0, 64));  // q and k swapped
  EXPECT_NE(h, config_hash(4096, 1024, 4, 1e-6f, 0, 64));
  EXPECT_NE(h, config_hash(4096, 1024, 1, 1e-6f, 0, 64));
  EXPECT_NE(h, config_hash(4096, 1024, 2, 1e-5f, 0, 64));
  EXPECT_NE(h, config_hash(4096, 1024, 2, 1.0000001e-6f, 0, 64));
  EXPECT_NE(h, config_hash(4096, 1024, 2, 1e-6f, 1, 64));
  EXPECT_NE(h, config_hash(4096, 1024, 2, 1e-6f, 0, 63));  // another token count
  EXPECT_NE(h, config_hash(4096, 1024, 2, 1e-6f, 0, 65));

  // Every hash over a grid of configurations has its top bit set; distinct inputs rarely collide.
  std::set<uint32_t> hashes;
  int configs = 0;
  for (int64_t q : {2048, 4096, 5120, 6144, 1000}) {
    for (int64_t k : {8, 1024, 4096, 5120}) {
      for (int world : {1, 2, 4, 8}) {
        for (float eps : {1e-5f, 1e-6f, 1e-8f}) {
          for (int order : {0, 1}) {
            const uint32_t x = config_hash(q, k, world, eps, order, 64);
            ASSERT_EQ(x >> 31, 1u);
            ASSERT_EQ(x, config_hash(q, k, world, eps, order, 64));
            hashes.insert(x);
            ++configs;
          }
        }
      }
    }
  }
  EXPECT_EQ(static_cast<int>(hashes.size()), configs);
}

TEST(ConfigHash, KTagIsNeverZeroNorAPlainTag) {
  std::vector<uint32_t> hashes;
  for (int64_t q : {2048, 4096, 5120}) {
    for (int world : {1, 2, 8}) {
      for (int order : {0, 1}) hashes.push_back(config_hash(q, 1024, world, 1e-6f, order, 64));
    }
  }
  // The claim is structural: every tag is in [1, 2^30] (top bit clear) and every hash has its
  // top bit set, so tag ^ hash has its top bit set. Check it over the ends of the tag range and
  // a stride through the middle.
  std::vector<uint32_t> tags;
  for (uint32_t t = 1; t <= (1u << 16); ++t) tags.push_back(t);
  for (uint32_t t = (1u << 30) - (1u << 16); t <= (1u << 30); ++t) tags.push_back(t);
  for (uint32_t t = 1; t <= (1u << 30); t += 4099) tags.push_back(t);
  for (uint32_t h : hashes) {
    for (uint32_t t : tags) {
      const uint32_t kt = t ^ h;
      ASSERT_NE(kt, 0u) << "tag " << t << " hash " << h;
      ASSERT_GT(kt, 1u << 30) << "tag " << t << " hash " << h;  // so never a plain tag
      ASSERT_EQ(kt ^ h, t);
    }
  }
  // And via the real call->tag map at the wrap.
  for (uint32_t h : hashes) {
    for (uint32_t c = 0x3ffffff0u; c != 0x10u; c = next_call(c)) {
      ASSERT_NE(tag_for_call(c) ^ h, 0u);
      ASSERT_NE(tag_for_call(c) ^ h, tag_for_call(c));
    }
  }
}

}  // namespace
}  // namespace swiftqk
