# FindNCCL: locates NCCL's header and shared library and defines the imported target NCCL::NCCL.
#
# Looked for under NCCL_ROOT (CMake variable or environment), NCCL_HOME, the directories in
# NCCL_HINTS (a list, e.g. the nvidia-nccl wheel PyTorch loads) and the CUDA toolkit's.
# Sets NCCL_FOUND, NCCL_INCLUDE_DIR, NCCL_LIBRARY and NCCL_VERSION (from nccl.h).
#
# The shared library is taken, never libnccl_static.a: a static NCCL carries its own copy of
# libstdc++ internals, which crashed inside PyTorch's process as soon as an error message
# formatted an integer.
if(NOT CUDAToolkit_FOUND)
  find_package(CUDAToolkit QUIET)
endif()
set(_nccl_hints ${NCCL_HINTS} $ENV{NCCL_ROOT} $ENV{NCCL_HOME})
if(CUDAToolkit_FOUND)
  list(APPEND _nccl_hints ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_LIBRARY_DIR}
       ${CUDAToolkit_LIBRARY_ROOT})
endif()
find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_hints} /usr/local/include
          PATH_SUFFIXES include)
find_library(NCCL_LIBRARY NAMES libnccl.so libnccl.so.2 NAMES_PER_DIR
             HINTS ${_nccl_hints} PATH_SUFFIXES lib lib64)
unset(_nccl_hints)

if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_version_lines
       REGEX "^#define NCCL_(MAJOR|MINOR|PATCH)[ \t]+[0-9]+")
  foreach(_part MAJOR MINOR PATCH)
    string(REGEX REPLACE ".*#define NCCL_${_part}[ \t]+([0-9]+).*" "\\1" _nccl_${_part}
                         "${_nccl_version_lines}")
  endforeach()
  if(_nccl_MAJOR MATCHES "^[0-9]+$" AND _nccl_MINOR MATCHES "^[0-9]+$"
     AND _nccl_PATCH MATCHES "^[0-9]+$")
    set(NCCL_VERSION "${_nccl_MAJOR}.${_nccl_MINOR}.${_nccl_PATCH}")
  endif()
  unset(_nccl_version_lines)
  unset(_nccl_MAJOR)
  unset(_nccl_MINOR)
  unset(_nccl_PATCH)
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR
                                  VERSION_VAR NCCL_VERSION)
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)

if(NCCL_FOUND AND NOT TARGET NCCL::NCCL)
  add_library(NCCL::NCCL UNKNOWN IMPORTED)
  set_target_properties(NCCL::NCCL PROPERTIES IMPORTED_LOCATION "${NCCL_LIBRARY}"
                                              INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
