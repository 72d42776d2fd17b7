// The first line of every GPU test: on a machine without a CUDA GPU the test skips and says why.
#pragma once

#include <gtest/gtest.h>

#include "problem.hpp"

#define REQUIRE_GPU()                 \
  if (!::swiftqk::testing::has_gpu()) \
  GTEST_SKIP() << "no CUDA GPU on this machine: GPU test skipped"
