// The CPU tests' check that a call is refused with swiftqk::Error saying what was wrong.
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <string>

#include "swiftqk/error.hpp"

namespace swiftqk {

/// Runs fn, which must throw swiftqk::Error whose what() contains `needle`.
template <typename Fn>
::testing::AssertionResult ThrowsErrorWith(Fn&& fn, const std::string& needle) {
  try {
    fn();
  } catch (const Error& e) {
    const std::string what = e.what();
    if (what.find(needle) != std::string::npos) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << "what() = \"" << what << "\" lacks \"" << needle << "\"";
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw a non-swiftqk exception: " << e.what();
  }
  return ::testing::AssertionFailure() << "did not throw";
}

}  // namespace swiftqk
