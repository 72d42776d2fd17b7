// The communicators created from Python, and how an op turns the int it receives back into one.
// A schema can carry no custom class here, so the ops take a communicator as an int handle; the
// registry turns a stale or forged value into an error instead of a crash.
#pragma once

#include <cstdint>
#include <memory>

#include "swiftqk/communicator.hpp"

namespace swiftqk_torch {

/// @brief A Communicator owned by Python, registered as live for as long as it exists.
class PyCommunicator {
 public:
  explicit PyCommunicator(swiftqk::Communicator c);
  ~PyCommunicator();
  PyCommunicator(const PyCommunicator&) = delete;
  PyCommunicator& operator=(const PyCommunicator&) = delete;
  swiftqk::Communicator& get() { return *comm_; }
  /// @brief The int the ops take (swiftqk.Communicator.handle in Python).
  int64_t handle() const { return reinterpret_cast<int64_t>(comm_.get()); }

 private:
  std::unique_ptr<swiftqk::Communicator> comm_;
};

/// @brief The live communicator behind `handle`; raises a c10::Error naming `op` (for example
/// "swiftqk.qk_norm") when no live PyCommunicator has that handle.
swiftqk::Communicator& communicator_of(int64_t handle, const char* op);

}  // namespace swiftqk_torch
