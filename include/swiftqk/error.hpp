// SwiftQK's one error type and the macros that raise it.
#pragma once

#include <stdexcept>
#include <string>

namespace swiftqk {

/// @brief The single exception type thrown by SwiftQK. what() reads "file:line: message".
class Error : public std::runtime_error {
 public:
  Error(const std::string& message, const char* file, int line)
      : std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + message),
        file_(file),
        line_(line) {}
  const char* file() const noexcept { return file_; }
  int line() const noexcept { return line_; }

 private:
  const char* file_;
  int line_;
};

namespace detail {
[[noreturn]] inline void fail(const std::string& message, const char* file, int line) {
  throw Error(message, file, line);
}
}  // namespace detail

}  // namespace swiftqk

/// @brief Throws swiftqk::Error naming the broken expectation when cond is false.
#define SWIFTQK_EXPECTS(cond, message)                                   \
  do {                                                                   \
    if (!(cond)) ::swiftqk::detail::fail((message), __FILE__, __LINE__); \
  } while (0)

/// @brief Throws swiftqk::Error unconditionally.
#define SWIFTQK_FAIL(message) ::swiftqk::detail::fail((message), __FILE__, __LINE__)
