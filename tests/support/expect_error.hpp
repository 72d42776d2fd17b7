// The tests' one way to say "this call is refused, and the refusal says why": a callable must
// throw swiftqk::Error whose what() contains every given part. A mismatch quotes the message
// that was thrown, so a failing test shows what the library said instead.
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

#include "swiftqk/error.hpp"

namespace swiftqk::testing {

/// Success when fn() throws swiftqk::Error whose what() contains every one of `parts` (none:
/// any message); else a failure naming what was thrown, or that nothing was. For helpers that
/// wrap a refused call and hand the result to EXPECT_TRUE; tests call expect_error.
template <typename Fn>
::testing::AssertionResult throws_error(Fn&& fn, std::initializer_list<std::string_view> parts) {
  try {
    fn();
  } catch (const Error& e) {
    const std::string what = e.what();
    std::string missing;
    for (std::string_view part : parts) {
      if (what.find(part) == std::string::npos) {
        missing += std::string(missing.empty() ? "" : ", ") + "\"" + std::string(part) + "\"";
      }
    }
    if (missing.empty()) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << "swiftqk::Error without " << missing << ": \"" << what << "\"";
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw a non-swiftqk exception: \"" << e.what() << "\"";
  } catch (...) {
    return ::testing::AssertionFailure() << "threw something other than an exception";
  }
  return ::testing::AssertionFailure() << "threw nothing";
}

/// throws_error with one part.
template <typename Fn>
::testing::AssertionResult throws_error(Fn&& fn, std::string_view part) {
  return throws_error(std::forward<Fn>(fn), {part});
}

/// Expects fn() to throw swiftqk::Error whose what() contains every one of `parts`; a failure is
/// reported at the caller's file and line. Returns whether it did.
template <typename Fn>
bool expect_error(Fn&& fn, std::initializer_list<std::string_view> parts = {},
                  const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  const ::testing::AssertionResult r = throws_error(fn, parts);
  if (!r) ADD_FAILURE_AT(file, line) << r.message();
  return static_cast<bool>(r);
}

/// The same with one part.
template <typename Fn>
bool expect_error(Fn&& fn, std::string_view part, const char* file = __builtin_FILE(),
                  int line = __builtin_LINE()) {
  return expect_error(fn, std::initializer_list<std::string_view>{part}, file, line);
}

}  // namespace swiftqk::testing
