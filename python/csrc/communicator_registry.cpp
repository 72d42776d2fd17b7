// The registry of live Python communicators (communicator_registry.hpp).
#include "communicator_registry.hpp"

#include <c10/util/Exception.h>

#include <mutex>
#include <set>
#include <utility>

namespace swiftqk_torch {
namespace {

std::mutex g_registry_mutex;
std::set<const swiftqk::Communicator*> g_registry;

}  // namespace

PyCommunicator::PyCommunicator(swiftqk::Communicator c)
    : comm_(std::make_unique<swiftqk::Communicator>(std::move(c))) {
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  g_registry.insert(comm_.get());
}

PyCommunicator::~PyCommunicator() {
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  g_registry.erase(comm_.get());
}

swiftqk::Communicator& communicator_of(int64_t handle, const char* op) {
  auto* c = reinterpret_cast<swiftqk::Communicator*>(handle);
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  TORCH_CHECK(g_registry.count(c) == 1, op, ": comm is not a live swiftqk Communicator handle");
  return *c;
}

}  // namespace swiftqk_torch
