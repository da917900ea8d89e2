# TensorFlow op library: _tfring_ops.so, built when TensorFlow is importable.
#
# The op library is compiled against the TensorFlow that Python_EXECUTABLE
# imports, with the flags tf.sysconfig reports (include dir, C++ ABI, C++
# standard, Eigen alignment) and linked to libtensorflow_framework and to
# tfring_core (one runtime per process: _core and the op library share it).
#
# TFRING_WITH_TF: AUTO builds it when TensorFlow imports and skips it with a
# message otherwise; ON makes a missing or unusable TensorFlow fatal; OFF
# skips it. TFRING_TF_PYTHONPATH: sys.path entries where TensorFlow lives, for
# builds whose interpreter cannot see it (pip's build isolation; setup.py
# finds and passes it).
#
# The TensorFlow version is written next to the library
# (_tfring_ops.so.tfversion); tfring/ops.py compares it with tf.__version__
# before loading, since a library built against another TensorFlow fails
# with undefined symbols or worse.
#
# TFRING_TF_GPU: DEVICE_GPU kernels for the ops (same kernel classes as the
# CPU ones, see csrc/tf/adapter.h). They hand TF's stream and device
# pointers to tfring_core, so they need a TensorFlow built with CUDA and a
# tfring_core built with CUDA (cmake/cuda.cmake), of the same CUDA major
# version as TensorFlow: the core links its CUDA runtime statically, and one
# of another major version would need a newer driver than TensorFlow does
# (CUDA 13 needs r580+). The op library itself needs no nvcc and no CUDA
# headers (only TF's stream_executor interface: no GOOGLE_CUDA), so the GPU
# code is always compiled; the option decides whether the GPU kernels are
# registered. AUTO registers them when all of the above holds; ON also when
# only the CUDA major versions differ (with a warning), and fails when
# anything else is missing; OFF never. The outcome and its reason are
# written to _tfring_ops.so.gpu next to the library.
set(TFRING_HAVE_TF OFF)
set(TFRING_TF_GPU AUTO CACHE STRING
    "Register the ops' GPU kernels: AUTO (when TF and tfring_core have CUDA of one major version), ON, OFF")
set(TFRING_TF_PYTHONPATH "" CACHE STRING
    "Where TensorFlow is importable from when Python_EXECUTABLE cannot see it")
# TFRING_TF_RPATH: where the op library looks for libtensorflow_framework.so.2
# and libtensorflow_cc.so.2 when they are not loaded yet. ABSOLUTE (for builds
# used in place: the source tree, an editable install) adds the build's
# TensorFlow lib dir; RELATIVE (wheels, `pip install .`) only
# $ORIGIN/../tensorflow, the installed tensorflow package beside tfring, so
# no path of the build machine is baked in. Either way TensorFlow has
# already loaded both libraries when tf.load_op_library runs, and the loader
# matches them by soname, so a TensorFlow installed elsewhere (another
# site-packages on sys.path) is found too.
set(TFRING_TF_RPATH ABSOLUTE CACHE STRING
    "Run path to TensorFlow's libraries: ABSOLUTE (build's lib dir too) or RELATIVE ($ORIGIN/../tensorflow only)")

string(TOUPPER "${TFRING_WITH_TF}" _tf_mode)
if(_tf_mode STREQUAL "OFF")
  message(STATUS "TensorFlow op library: disabled (TFRING_WITH_TF=OFF)")
  return()
endif()

# Skips the op library under AUTO, stops the build under ON.
macro(_tfring_tf_unavailable why)
  if(_tf_mode STREQUAL "ON")
    message(FATAL_ERROR "TFRING_WITH_TF=ON but ${why}")
  endif()
  message(STATUS "TensorFlow op library: skipped (${why})")
  return()
endmacro()

if(NOT Python_EXECUTABLE)
  find_package(Python COMPONENTS Interpreter)
endif()
if(NOT Python_EXECUTABLE)
  _tfring_tf_unavailable("no Python interpreter was found")
endif()

set(_tf_env ${CMAKE_COMMAND} -E env TF_CPP_MIN_LOG_LEVEL=3)
if(TFRING_TF_PYTHONPATH)
  # Replaces (not extends) PYTHONPATH: pip's isolation hook lives there and
  # would hide the real site-packages again.
  list(APPEND _tf_env --unset=PYTHONNOUSERSITE
       "PYTHONPATH=${TFRING_TF_PYTHONPATH}")
endif()
set(_tf_query [=[
import tensorflow as tf
print("version=" + tf.__version__)
print("cflags=" + ";".join(tf.sysconfig.get_compile_flags()))
print("lflags=" + ";".join(tf.sysconfig.get_link_flags()))
print("libdir=" + tf.sysconfig.get_lib())
info = tf.sysconfig.get_build_info()
print("cuda=" + (info.get("cuda_version", "") if info.get("is_cuda_build") else ""))
]=])
execute_process(
  COMMAND ${_tf_env} ${Python_EXECUTABLE} -c "${_tf_query}"
  RESULT_VARIABLE _tf_rc OUTPUT_VARIABLE _tf_out ERROR_VARIABLE _tf_err)
if(NOT _tf_rc EQUAL 0)
  string(REGEX REPLACE ".*\n([^\n]+)\n?$" "\\1" _tf_last "${_tf_err}")
  _tfring_tf_unavailable(
    "TensorFlow does not import with ${Python_EXECUTABLE}: ${_tf_last}")
endif()
string(REGEX MATCH "version=([^\n]*)" _ "${_tf_out}")
set(TFRING_TF_VERSION "${CMAKE_MATCH_1}")
string(REGEX MATCH "cflags=([^\n]*)" _ "${_tf_out}")
set(_tf_cflags "${CMAKE_MATCH_1}")
string(REGEX MATCH "lflags=([^\n]*)" _ "${_tf_out}")
set(_tf_lflags "${CMAKE_MATCH_1}")
string(REGEX MATCH "libdir=([^\n]*)" _ "${_tf_out}")
set(_tf_libdir "${CMAKE_MATCH_1}")
string(REGEX MATCH "cuda=([^\n]*)" _ "${_tf_out}")
set(_tf_cuda "${CMAKE_MATCH_1}")

# Sort TF's compile flags into include dirs, definitions and the standard.
set(_tf_includes)
set(_tf_defines)
set(_tf_std "")
set(_tf_abi "")
foreach(_flag IN LISTS _tf_cflags)
  if(_flag MATCHES "^-I(.+)$")
    list(APPEND _tf_includes "${CMAKE_MATCH_1}")
  elseif(_flag MATCHES "^-D_GLIBCXX_USE_CXX11_ABI=([01])$")
    set(_tf_abi "${CMAKE_MATCH_1}")
  elseif(_flag MATCHES "^-D(.+)$")
    list(APPEND _tf_defines "${CMAKE_MATCH_1}")
  elseif(_flag MATCHES "^--?std=(c|gnu)\\+\\+([0-9]+)$")
    set(_tf_std "${CMAKE_MATCH_2}")
  endif()
endforeach()

# The op library calls the core through runtime.h (std::string, std::vector,
# std::function), so both must use the same libstdc++ string ABI. The core is
# built with the compiler's default; refuse a TensorFlow that wants the other.
if(NOT _tf_abi STREQUAL "")
  include(CheckCXXSourceCompiles)
  set(_abi_probe "#include <string>
#if !defined(_GLIBCXX_USE_CXX11_ABI) || _GLIBCXX_USE_CXX11_ABI != ${_tf_abi}
#error different ABI
#endif
int main() { return 0; }
")
  check_cxx_source_compiles("${_abi_probe}" TFRING_CORE_ABI_MATCHES_TF_${_tf_abi})
  if(NOT TFRING_CORE_ABI_MATCHES_TF_${_tf_abi})
    _tfring_tf_unavailable(
      "TensorFlow ${TFRING_TF_VERSION} uses -D_GLIBCXX_USE_CXX11_ABI=${_tf_abi}, "
      "which differs from this compiler's default that tfring_core is built "
      "with; std::string crosses runtime.h, so the two cannot be mixed")
  endif()
endif()
if(_tf_std AND _tf_std GREATER CMAKE_CXX_STANDARD)
  message(WARNING "TensorFlow ${TFRING_TF_VERSION} asks for C++${_tf_std}; "
    "the op library uses it, tfring_core stays on C++${CMAKE_CXX_STANDARD}")
endif()

file(GLOB TFRING_TF_SRCS CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/csrc/tf/*.cc)
# The XLA kernels and custom-call targets are added by cmake/tf_xla.cmake.
list(FILTER TFRING_TF_SRCS EXCLUDE REGEX "/xla_[^/]*\\.cc$")
add_library(_tfring_ops MODULE ${TFRING_TF_SRCS})
target_include_directories(_tfring_ops SYSTEM PRIVATE ${_tf_includes})
target_compile_definitions(_tfring_ops PRIVATE ${_tf_defines}
  TFRING_TF_VERSION="${TFRING_TF_VERSION}")
if(NOT _tf_abi STREQUAL "")
  target_compile_definitions(_tfring_ops PRIVATE _GLIBCXX_USE_CXX11_ABI=${_tf_abi})
endif()
if(_tf_std AND _tf_std GREATER CMAKE_CXX_STANDARD)
  set_target_properties(_tfring_ops PROPERTIES CXX_STANDARD ${_tf_std})
endif()
# TF's headers are noisy under -Wextra even as system headers (templates).
target_compile_options(_tfring_ops PRIVATE -Wno-sign-compare -Wno-unused-parameter)
target_link_libraries(_tfring_ops PRIVATE tfring_core ${_tf_lflags})
add_dependencies(_tfring_ops tfring_layers)
# Exports nothing (cmake/exports/tf_ops.map): TF finds the ops through the
# registrations the library's static initializers make.
tfring_export_only(_tfring_ops tf_ops)
set(_tf_rpath "$ORIGIN;$ORIGIN/../tensorflow")
string(TOUPPER "${TFRING_TF_RPATH}" _tf_rpath_mode)
if(_tf_rpath_mode STREQUAL "ABSOLUTE")
  list(APPEND _tf_rpath "${_tf_libdir}")
elseif(NOT _tf_rpath_mode STREQUAL "RELATIVE")
  message(FATAL_ERROR "TFRING_TF_RPATH must be ABSOLUTE or RELATIVE, got '${TFRING_TF_RPATH}'")
endif()
set_target_properties(_tfring_ops PROPERTIES
  CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON
  PREFIX ""
  SUFFIX ".so"
  LIBRARY_OUTPUT_DIRECTORY ${TFRING_OUTPUT_DIR}
  BUILD_RPATH "${_tf_rpath}"
  INSTALL_RPATH "${_tf_rpath}")

set(_tf_stamp ${CMAKE_CURRENT_BINARY_DIR}/_tfring_ops.so.tfversion)
file(WRITE ${_tf_stamp} "${TFRING_TF_VERSION}\n")
add_custom_command(TARGET _tfring_ops POST_BUILD
  COMMAND ${CMAKE_COMMAND} -E copy_if_different ${_tf_stamp}
          ${TFRING_OUTPUT_DIR}/_tfring_ops.so.tfversion
  VERBATIM)

set(TFRING_HAVE_TF ON)
message(STATUS "TensorFlow op library: building against TensorFlow "
  "${TFRING_TF_VERSION} (${_tf_libdir})")

# ------------------------------------------------------- GPU kernels ----
string(TOUPPER "${TFRING_TF_GPU}" _tf_gpu_mode)
string(REGEX MATCH "^[0-9]+" _tf_cuda_major "${_tf_cuda}")
string(REGEX MATCH "^[0-9]+" _core_cuda_major "${CUDAToolkit_VERSION}")
set(_tf_gpu OFF)
if(_tf_gpu_mode STREQUAL "OFF")
  set(_tf_gpu_why "TFRING_TF_GPU=OFF")
elseif(_tf_cuda STREQUAL "")
  set(_tf_gpu_why "TensorFlow ${TFRING_TF_VERSION} is not built with CUDA")
elseif(NOT TFRING_HAVE_CUDA)
  set(_tf_gpu_why "tfring_core is built without CUDA (no nvcc found, or \
TFRING_WITH_CUDA=OFF); TensorFlow ${TFRING_TF_VERSION} is built with CUDA \
${_tf_cuda}: set CMAKE_CUDA_COMPILER to a CUDA ${_tf_cuda_major} nvcc")
elseif(NOT _core_cuda_major STREQUAL _tf_cuda_major)
  if(_tf_gpu_mode STREQUAL "ON")
    message(WARNING "TFRING_TF_GPU=ON: registering the GPU kernels although \
tfring_core is built with CUDA ${CUDAToolkit_VERSION} and TensorFlow \
${TFRING_TF_VERSION} with CUDA ${_tf_cuda}; GPU ops will need a driver for \
CUDA ${_core_cuda_major}")
    set(_tf_gpu ON)
    set(_tf_gpu_why "TensorFlow CUDA ${_tf_cuda}, tfring_core CUDA \
${CUDAToolkit_VERSION}, forced by TFRING_TF_GPU=ON")
  else()
    set(_tf_gpu_why "tfring_core is built with CUDA ${CUDAToolkit_VERSION} \
(${CMAKE_CUDA_COMPILER}) but TensorFlow ${TFRING_TF_VERSION} with CUDA \
${_tf_cuda}: set CMAKE_CUDA_COMPILER to a CUDA ${_tf_cuda_major} nvcc (the \
nvidia-cuda-nvcc-cu${_tf_cuda_major} wheel has ptxas, not nvcc), or \
TFRING_TF_GPU=ON to register them anyway")
  endif()
else()
  set(_tf_gpu ON)
  set(_tf_gpu_why "TensorFlow CUDA ${_tf_cuda}, tfring_core CUDA ${CUDAToolkit_VERSION}")
endif()
if(NOT _tf_gpu AND _tf_gpu_mode STREQUAL "ON")
  message(FATAL_ERROR "TFRING_TF_GPU=ON but ${_tf_gpu_why}")
endif()
if(_tf_gpu)
  target_compile_definitions(_tfring_ops PRIVATE TFRING_TF_GPU=1)
  message(STATUS "TensorFlow op library: GPU kernels on (${_tf_gpu_why})")
  file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/_tfring_ops.so.gpu "on: ${_tf_gpu_why}\n")
else()
  message(STATUS "TensorFlow op library: GPU kernels off (${_tf_gpu_why})")
  file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/_tfring_ops.so.gpu "off: ${_tf_gpu_why}\n")
endif()
add_custom_command(TARGET _tfring_ops POST_BUILD
  COMMAND ${CMAKE_COMMAND} -E copy_if_different
          ${CMAKE_CURRENT_BINARY_DIR}/_tfring_ops.so.gpu
          ${TFRING_OUTPUT_DIR}/_tfring_ops.so.gpu
  VERBATIM)
