// Communicator::from_nccl. One GPU allows a group of one (NCCL refuses two ranks on one GPU);
// larger groups run under the multi-GPU issue.
#include <gtest/gtest.h>
#include <nccl.h>

#include "problem.hpp"

namespace swiftqk::testing {
namespace {

TEST(NcclBootstrap, GroupOfOne) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine: GPU test skipped";
  SWIFTQK_CUDA_TRY(cudaSetDevice(0));
  ncclUniqueId id;
  SWIFTQK_NCCL_TRY(ncclGetUniqueId(&id));
  ncclComm_t nc;
  SWIFTQK_NCCL_TRY(ncclCommInitRank(&nc, 1, id, 0));
  cudaStream_t s;
  SWIFTQK_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  {
    Communicator comm = Communicator::from_nccl(nc, CommConfig{}, s);
    EXPECT_EQ(comm.rank(), 0);
    EXPECT_EQ(comm.world_size(), 1);
    Problem p = Problem::random(100, 2048, 2048, DType::kBF16, NormOrder::kLlama, 1e-5f, 3);
    RankData d = make_rank(p, 1, 0, Layout::kSeparate);
    poison(d, s);
    launch_qk_norm(comm, d.params, s);
    comm.synchronize(s);
    EXPECT_EQ(check_ranks(p, 1, {&d}).wrong, 0);
  }
  SWIFTQK_NCCL_TRY(ncclCommDestroy(nc));
  SWIFTQK_CUDA_TRY(cudaStreamDestroy(s));
}

}  // namespace
}  // namespace swiftqk::testing
