// PyTorch binding: the schema-registered custom op torch.ops.swiftqk.qk_norm (its CUDA kernel;
// the fake kernel that checks shapes, dtypes and devices for torch.compile and meta tensors is
// registered in Python, swiftqk/ops.py) and the communicator classes for Python. The fused QK
// epilogue's op is swiftqk_epilogue_torch.cpp.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <pybind11/stl.h>
#include <torch/extension.h>
#include <torch/library.h>
#include <torch/version.h>

#include <memory>
#include <string>
#include <vector>

#include "communicator_registry.hpp"
#include "swiftqk/communicator.hpp"
#include "swiftqk/error.hpp"
#include "tensor_dtype.hpp"

namespace py = pybind11;

namespace {

using swiftqk_torch::communicator_of;
using swiftqk_torch::PyCommunicator;

swiftqk::DType dtype_of(const at::Tensor& t, const char* name) {
  return swiftqk_torch::dtype_of(t, "swiftqk.qk_norm: ", name,
                                 "float32, float16, bfloat16 or float8_e4m3fn");
}

swiftqk::ShardView shard_of(const char* name, const at::Tensor& in, const at::Tensor& weight,
                            const at::Tensor& out, double scale) {
  TORCH_CHECK(in.dim() == 2 && out.dim() == 2, "swiftqk.qk_norm: ", name,
              " and its output must be 2-D [tokens, local width]");
  TORCH_CHECK(in.sizes() == out.sizes(), "swiftqk.qk_norm: ", name, " is ", in.sizes(),
              " but its output is ", out.sizes());
  TORCH_CHECK(in.size(0) == 0 || (in.stride(1) == 1 && out.stride(1) == 1),
              "swiftqk.qk_norm: ", name, " rows must be contiguous (stride 1 along the width)");
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == in.size(1) && weight.is_contiguous(),
              "swiftqk.qk_norm: ", name, "_weight must be a contiguous [", in.size(1),
              "] shard of the norm weight");
  TORCH_CHECK(in.is_cuda() && out.is_cuda() && weight.is_cuda() && in.device() == out.device() &&
                  in.device() == weight.device(),
              "swiftqk.qk_norm: ", name, ", its weight and output must be on one CUDA device");
  swiftqk::ShardView v;
  v.in = in.data_ptr();
  v.out = out.data_ptr();
  v.weight = weight.data_ptr();
  v.width = in.size(1);
  v.in_stride = in.size(0) > 1 ? in.stride(0) : in.size(1);
  v.out_stride = out.size(0) > 1 ? out.stride(0) : out.size(1);
  v.in_scale = static_cast<float>(scale);
  return v;
}

void qk_norm_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& q_weight,
                  const at::Tensor& k_weight, at::Tensor& q_out, at::Tensor& k_out, int64_t comm,
                  int64_t q_full_width, int64_t k_full_width, double eps, int64_t order,
                  int64_t method, double q_scale, double k_scale, bool pdl, bool deterministic) {
  swiftqk::Communicator& c = communicator_of(comm, "swiftqk.qk_norm");
  TORCH_CHECK(q.size(0) == k.size(0), "swiftqk.qk_norm: q has ", q.size(0), " tokens, k ",
              k.size(0));
  TORCH_CHECK(q.device().index() == c.device(),
              "swiftqk.qk_norm: tensors are on cuda:", q.device().index(),
              " but the communicator is on cuda:", c.device());
  const swiftqk::DType in = dtype_of(q, "q");
  TORCH_CHECK(dtype_of(k, "k") == in, "swiftqk.qk_norm: q and k dtypes differ");
  const at::ScalarType out_t = in == swiftqk::DType::kF8E4M3 ? at::kBFloat16 : q.scalar_type();
  TORCH_CHECK(q_out.scalar_type() == out_t && k_out.scalar_type() == out_t &&
                  q_weight.scalar_type() == out_t && k_weight.scalar_type() == out_t,
              "swiftqk.qk_norm: outputs and weights must be ", out_t);
  TORCH_CHECK(order == 0 || order == 1, "swiftqk.qk_norm: order must be 0 (olmo2) or 1 (llama)");
  swiftqk::QkNormParams p;
  p.q = shard_of("q", q, q_weight, q_out, q_scale);
  p.k = shard_of("k", k, k_weight, k_out, k_scale);
  p.tokens = q.size(0);
  p.q_full_width = q_full_width;
  p.k_full_width = k_full_width;
  p.in_dtype = in;
  p.eps = static_cast<float>(eps);
  p.order = static_cast<swiftqk::NormOrder>(order);
  p.method = static_cast<swiftqk::Method>(method);
  p.pdl = pdl;
  p.deterministic = deterministic;
  const c10::cuda::CUDAGuard guard(q.device());
  try {
    swiftqk::launch_qk_norm(c, p, c10::cuda::getCurrentCUDAStream().stream());
  } catch (const swiftqk::Error& e) {
    TORCH_CHECK(false, e.what());
  }
}

template <typename F>
auto translate(F f) {
  try {
    return f();
  } catch (const swiftqk::Error& e) {
    throw std::runtime_error(e.what());
  }
}

swiftqk::CommConfig config_of(int64_t capacity, double timeout_s, int sm_budget) {
  swiftqk::CommConfig cfg;
  cfg.token_capacity = capacity;
  cfg.timeout_s = timeout_s;
  cfg.sm_budget = sm_budget;
  return cfg;
}

}  // namespace

TORCH_LIBRARY(swiftqk, m) {
  // The fake kernel lives in this Python module; torch imports it when it needs the fake and
  // checks that the registration came from there.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5)
  m.set_python_module("swiftqk.ops");
#else
  m.impl_abstract_pystub("swiftqk.ops");
#endif
  m.def(
      "qk_norm(Tensor q, Tensor k, Tensor q_weight, Tensor k_weight, Tensor(a!) q_out, "
      "Tensor(b!) k_out, int comm, int q_full_width, int k_full_width, float eps, int order, "
      "int method, float q_scale=1.0, float k_scale=1.0, bool pdl=False, "
      "bool deterministic=False) -> ()");
}
TORCH_LIBRARY_IMPL(swiftqk, CUDA, m) { m.impl("qk_norm", &qk_norm_cuda); }

PYBIND11_MODULE(_C, m) {
  m.doc() = "SwiftQK: tensor-parallel QK-RMSNorm (communicators; the op is torch.ops.swiftqk)";
  // The torch this module was built against (python/CMakeLists.txt); swiftqk refuses to load it
  // under another.
  m.attr("TORCH_VERSION") = SWIFTQK_TORCH_VERSION;
  // The op's int arguments, named as the C++ enums name them, so Python never copies the values.
  py::dict orders, fused_methods;
  for (const auto o : {swiftqk::NormOrder::kOlmo2, swiftqk::NormOrder::kLlama}) {
    orders[py::str(swiftqk::to_string(o))] = static_cast<int>(o);
  }
  for (const auto f : {swiftqk::Method::kSwiftQK, swiftqk::Method::kMiniMaxFused}) {
    fused_methods[py::str(swiftqk::to_string(f))] = static_cast<int>(f);
  }
  m.attr("ORDERS") = orders;
  m.attr("FUSED_METHODS") = fused_methods;
  py::class_<PyCommunicator>(m, "Communicator")
      .def_property_readonly("rank", [](PyCommunicator& c) { return c.get().rank(); })
      .def_property_readonly("world_size", [](PyCommunicator& c) { return c.get().world_size(); })
      .def_property_readonly("device", [](PyCommunicator& c) { return c.get().device(); })
      .def_property_readonly("handle", &PyCommunicator::handle)
      .def("probe_peers",
           [](PyCommunicator& c, int64_t stream) {
             return translate(
                 [&] { return c.get().probe_peers(reinterpret_cast<cudaStream_t>(stream)); });
           })
      .def("check_error", [](PyCommunicator& c) { translate([&] { c.get().check_error(); }); })
      .def("synchronize",
           [](PyCommunicator& c, int64_t stream) {
             translate([&] { c.get().synchronize(reinterpret_cast<cudaStream_t>(stream)); });
           })
      .def("failure", [](PyCommunicator& c) { return c.get().failure().describe(); })
      .def("reset", [](PyCommunicator& c) { translate([&] { c.get().reset(); }); })
      .def("close", [](PyCommunicator& c) { translate([&] { c.get().close(); }); })
      .def("close_without_barrier",
           [](PyCommunicator& c) { translate([&] { c.get().close_without_barrier(); }); })
      .def_property_readonly("closed", [](PyCommunicator& c) { return c.get().closed(); })
      .def_property_readonly("failure_code",
                             [](PyCommunicator& c) { return c.get().failure().code; })
      .def_property_readonly("sm_budget",
                             [](PyCommunicator& c) { return c.get().config().sm_budget; })
      .def_property_readonly("timeout_s",
                             [](PyCommunicator& c) { return c.get().config().timeout_s; });

  py::class_<swiftqk::IpcBootstrap>(m, "IpcBootstrap")
      .def(py::init([](int rank, int world, int device, int64_t capacity, double timeout_s,
                       int sm_budget) {
             return translate([&] {
               return std::make_unique<swiftqk::IpcBootstrap>(
                   rank, world, device, config_of(capacity, timeout_s, sm_budget));
             });
           }),
           py::arg("rank"), py::arg("world_size"), py::arg("device"),
           py::arg("token_capacity") = 16384, py::arg("timeout_s") = 5.0, py::arg("sm_budget") = 0)
      .def("local_handle",
           [](swiftqk::IpcBootstrap& b) {
             const std::vector<uint8_t> h = translate([&] { return b.local_handle(); });
             return py::bytes(reinterpret_cast<const char*>(h.data()), h.size());
           })
      .def("connect", [](swiftqk::IpcBootstrap& b, const std::vector<std::string>& handles) {
        std::vector<std::vector<uint8_t>> hs;
        for (const auto& h : handles) hs.emplace_back(h.begin(), h.end());
        return translate([&] { return std::make_unique<PyCommunicator>(b.connect(hs)); });
      });

  m.def(
      "create_local_group",
      [](const std::vector<int>& devices, int64_t capacity, double timeout_s, int sm_budget) {
        return translate([&] {
          std::vector<std::unique_ptr<PyCommunicator>> out;
          for (auto& c : swiftqk::Communicator::create_local_group(
                   devices, config_of(capacity, timeout_s, sm_budget))) {
            out.push_back(std::make_unique<PyCommunicator>(std::move(c)));
          }
          return out;
        });
      },
      py::arg("devices"), py::arg("token_capacity") = 16384, py::arg("timeout_s") = 5.0,
      py::arg("sm_budget") = 0);
}
