# The layers of csrc/ as build targets.
#
# cmake/layers.py holds the layers, their order and the rule between them:
# a layer's files include only their own layer's headers and those of the
# layers below it. Here every core layer (common, rendezvous, kernels,
# transport, collectives, gpu, runtime) becomes an OBJECT library,
# tfring_<layer>, that links the layers below it PRIVATE; libtfring_core.so
# is made of their objects. The tops, tf (_tfring_ops.so) and python
# (tfring._core), are their own targets already and link tfring_core.
#
# Enforcement: the target tfring_layers runs cmake/layers.py over csrc/
# whenever a source or header changes, and every layer target, the CUDA
# kernels and both tops depend on it. An upward include (gpu/ including
# runtime/, transport/ including collectives/, ...) therefore fails the
# build before anything compiles, naming the file, line and layers. All
# layers share csrc/ as include root, so the compiler alone would not
# refuse one. tests/core/test_layers.py runs the same script.
#
# tfring_build_flags carries what every core translation unit is compiled
# with (the csrc/ root, the CUDA or CUDA-emulation definitions that
# cmake/cuda.cmake adds); the layers and tfring_core link it.

if(Python_EXECUTABLE)
  set(_layers_python ${Python_EXECUTABLE})
else()
  find_package(Python3 COMPONENTS Interpreter REQUIRED)
  set(_layers_python ${Python3_EXECUTABLE})
endif()
set(_layers_script ${CMAKE_CURRENT_SOURCE_DIR}/cmake/layers.py)
set(_csrc ${CMAKE_CURRENT_SOURCE_DIR}/csrc)

execute_process(
  COMMAND ${_layers_python} ${_layers_script} --cmake-deps
  RESULT_VARIABLE _layers_rc OUTPUT_VARIABLE _layers_out ERROR_VARIABLE _layers_err)
if(NOT _layers_rc EQUAL 0)
  message(FATAL_ERROR "cmake/layers.py --cmake-deps failed: ${_layers_err}")
endif()
string(REPLACE "\n" ";" _layers_lines "${_layers_out}")

# ------------------------------------------------------------- check ----
file(GLOB_RECURSE _layers_files CONFIGURE_DEPENDS
  ${_csrc}/*.h ${_csrc}/*.hpp ${_csrc}/*.cc ${_csrc}/*.cpp
  ${_csrc}/*.cu ${_csrc}/*.cuh ${_csrc}/*.inc)
set(_layers_stamp ${CMAKE_CURRENT_BINARY_DIR}/layers.ok)
add_custom_command(
  OUTPUT ${_layers_stamp}
  COMMAND ${_layers_python} ${_layers_script} --root ${_csrc} --stamp ${_layers_stamp}
  DEPENDS ${_layers_script} ${_layers_files}
  COMMENT "Checking the layer order of csrc/ (cmake/layers.py)"
  VERBATIM)
add_custom_target(tfring_layers ALL DEPENDS ${_layers_stamp})

# ------------------------------------------------------------ layers ----
add_library(tfring_build_flags INTERFACE)
target_include_directories(tfring_build_flags INTERFACE ${_csrc})
target_link_libraries(tfring_build_flags INTERFACE Threads::Threads)

set(TFRING_CORE_LAYERS)
foreach(_line IN LISTS _layers_lines)
  if(NOT _line MATCHES "^([a-z_]+):(.*)$")
    continue()
  endif()
  set(_layer ${CMAKE_MATCH_1})
  string(REPLACE "," ";" _deps "${CMAKE_MATCH_2}")
  if(_layer STREQUAL "tf" OR _layer STREQUAL "python")
    continue()  # their own targets: _tfring_ops, _core
  endif()
  # The layer's portable sources; its CUDA and no-CUDA halves (cuda/,
  # nocuda/) are cmake/cuda.cmake's to add.
  file(GLOB_RECURSE _srcs CONFIGURE_DEPENDS ${_csrc}/${_layer}/*.cc)
  list(FILTER _srcs EXCLUDE REGEX "/(cuda|nocuda)/")
  add_library(tfring_${_layer} OBJECT ${_srcs})
  target_link_libraries(tfring_${_layer} PRIVATE tfring_build_flags)
  foreach(_dep IN LISTS _deps)
    target_link_libraries(tfring_${_layer} PRIVATE tfring_${_dep})
  endforeach()
  add_dependencies(tfring_${_layer} tfring_layers)
  list(APPEND TFRING_CORE_LAYERS ${_layer})
endforeach()
foreach(_layer common rendezvous kernels transport collectives gpu runtime)
  if(NOT TARGET tfring_${_layer})
    message(FATAL_ERROR "cmake/layers.py names no layer '${_layer}'")
  endif()
endforeach()
