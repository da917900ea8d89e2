# XLA support in the op library: XLA kernels for the collective ops
# (csrc/tf/xla_ops.cc) and the custom-call targets they compile to
# (csrc/tf/xla_custom_call.cc), so tf.function(jit_compile=True) runs them.
#
# Needs what TensorFlow's pip wheel ships: the tf2xla and XLA headers under
# its include dir, XlaOpKernel/XlaOpRegistrar from libtensorflow_cc.so.2, and
# XlaBuilder (xla::CustomCall) and the XLA FFI registry (XLA_FFI_GetApi) from
# libtensorflow_framework.so.2. The FFI handlers themselves use only the
# header-only C ABI (xla/ffi/api).
#
# TFRING_TF_XLA: AUTO builds it when the headers and libtensorflow_cc are
# found; ON makes their absence fatal; OFF leaves it out (the ops then refuse
# jit_compile at trace time). The outcome is written to _tfring_ops.so.xla.
set(TFRING_TF_XLA AUTO CACHE STRING
    "XLA kernels for the ops (jit_compile): AUTO (when TF ships the headers), ON, OFF")
string(TOUPPER "${TFRING_TF_XLA}" _tf_xla_mode)

set(_xla_on OFF)
set(_xla_why "")
if(_tf_xla_mode STREQUAL "OFF")
  set(_xla_why "TFRING_TF_XLA=OFF")
else()
  set(_tf_inc "")
  foreach(_dir IN LISTS _tf_includes)
    if(EXISTS "${_dir}/tensorflow/compiler/tf2xla/xla_op_kernel.h")
      set(_tf_inc "${_dir}")
    endif()
  endforeach()
  file(GLOB _tf_cc_lib "${_tf_libdir}/libtensorflow_cc.so*")
  list(SORT _tf_cc_lib)
  list(REVERSE _tf_cc_lib)  # libtensorflow_cc.so.2 before a bare .so link
  if(NOT _tf_inc)
    set(_xla_why "TensorFlow ${TFRING_TF_VERSION} ships no tf2xla headers")
  elseif(NOT EXISTS "${_tf_inc}/xla/ffi/api/ffi.h")
    set(_xla_why "TensorFlow ${TFRING_TF_VERSION} ships no XLA FFI headers (xla/ffi/api/ffi.h)")
  elseif(NOT _tf_cc_lib)
    set(_xla_why "no libtensorflow_cc.so in ${_tf_libdir}")
  else()
    set(_xla_on ON)
    list(GET _tf_cc_lib 0 _tf_cc_lib)
    set(_xla_why "TensorFlow ${TFRING_TF_VERSION}, ${_tf_cc_lib}")
  endif()
endif()
if(NOT _xla_on AND _tf_xla_mode STREQUAL "ON")
  message(FATAL_ERROR "TFRING_TF_XLA=ON but ${_xla_why}")
endif()

if(_xla_on)
  target_sources(_tfring_ops PRIVATE
    ${CMAKE_CURRENT_SOURCE_DIR}/csrc/tf/xla_ops.cc
    ${CMAKE_CURRENT_SOURCE_DIR}/csrc/tf/xla_custom_call.cc)
  # XLA's headers include these third-party ones by their own root.
  target_include_directories(_tfring_ops SYSTEM PRIVATE
    "${_tf_inc}/external/highwayhash"
    "${_tf_inc}/external/farmhash_archive/src")
  target_link_libraries(_tfring_ops PRIVATE "${_tf_cc_lib}")
  set_source_files_properties(
    ${CMAKE_CURRENT_SOURCE_DIR}/csrc/tf/xla_ops.cc
    ${CMAKE_CURRENT_SOURCE_DIR}/csrc/tf/xla_custom_call.cc
    PROPERTIES COMPILE_OPTIONS "-Wno-deprecated-declarations")
  message(STATUS "TensorFlow op library: XLA kernels on (${_xla_why})")
  file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/_tfring_ops.so.xla "on: ${_xla_why}\n")
else()
  message(STATUS "TensorFlow op library: XLA kernels off (${_xla_why})")
  file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/_tfring_ops.so.xla "off: ${_xla_why}\n")
endif()
add_custom_command(TARGET _tfring_ops POST_BUILD
  COMMAND ${CMAKE_COMMAND} -E copy_if_different
          ${CMAKE_CURRENT_BINARY_DIR}/_tfring_ops.so.xla
          ${TFRING_OUTPUT_DIR}/_tfring_ops.so.xla
  VERBATIM)
