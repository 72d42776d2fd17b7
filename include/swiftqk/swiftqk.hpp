// Everything a user of SwiftQK includes: the communicator and the launch calls, their parameters
// and settings, the element types and methods, the error type and what a failed wait recorded.
#pragma once

#include "swiftqk/comm_config.hpp"
#include "swiftqk/communicator.hpp"
#include "swiftqk/device_failure.hpp"
#include "swiftqk/error.hpp"
#include "swiftqk/launch_tuning.hpp"
#include "swiftqk/qk_epilogue_params.hpp"
#include "swiftqk/qk_norm_params.hpp"
#include "swiftqk/types.hpp"
