# GPU support: CUDA kernels (csrc/kernels/cuda/*.cu) and the GPU runtime
# (csrc/gpu/cuda/*.cc: streams, CUDA-IPC ring, NCCL backend) compiled into
# the kernels and gpu layers (cmake/layers.cmake) when nvcc is found (TFRING_WITH_CUDA=AUTO) or required (ON).
# Without CUDA, csrc/gpu/nocuda/*.cc stands in and a GPU tensor gets a clear
# "no CUDA support" error; everything else is identical.
#
# libtfring_core.so links the CUDA runtime statically (CUDA::cudart_static),
# without exporting any of it (cmake/exports.cmake), so it loads on machines
# without libcudart.so and never clashes with the CUDA runtime another
# library (TF, CuPy, PyTorch) brought; the driver (libcuda.so.1) is
# opened by that runtime on first use, so a machine without a GPU driver
# fails only when a GPU tensor is actually used. NCCL needs no headers or
# link step: csrc/gpu/nccl_loader.cc declares what it uses and dlopens
# libnccl.so.2 at run time.
#
# TFRING_CUDA_ARCHITECTURES: real architectures get SASS, the last one also
# PTX for newer GPUs to JIT. The default covers A100 (80) and H100/H200 (90)
# and keeps the compile short for CI; nvcc 13 no longer targets sm_70.
set(TFRING_HAVE_CUDA OFF)
set(TFRING_CUDA_ARCHITECTURES "80-real;90" CACHE STRING
    "CUDA architectures for the kernels (CMake CUDA_ARCHITECTURES syntax)")

string(TOUPPER "${TFRING_WITH_CUDA}" _cuda_mode)

# TFRING_WITH_CUDA=EMU: the CUDA emulation build, for tests on machines
# without a GPU. The unchanged kernel sources and GPU runtime are compiled
# with the host compiler against tests/cuda_emu/include and linked to a fake
# CUDA runtime (tests/cuda_emu/*.cc) whose streams are host threads and
# whose device memory and IPC handles are shared-memory mappings. It needs
# no CUDA toolkit. Never a product build: it reports itself through
# _core.cuda_emulated(), and GPU benchmarks refuse to run on it.
if(_cuda_mode STREQUAL "EMU")
  set(TFRING_HAVE_CUDA ON)
  set(TFRING_CUDA_EMULATION ON)
  message(STATUS "tfring: CUDA emulation build (GPU work runs on host threads; tests only)")
  file(GLOB _emu_kernel_srcs CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/csrc/kernels/cuda/*.cu)
  set_source_files_properties(${_emu_kernel_srcs} PROPERTIES
    LANGUAGE CXX COMPILE_OPTIONS "-xc++;-Wno-unknown-pragmas")
  file(GLOB _emu_gpu_srcs CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/csrc/gpu/cuda/*.cc)
  file(GLOB _emu_runtime_srcs CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/tests/cuda_emu/*.cc)
  target_sources(tfring_gpu PRIVATE ${_emu_gpu_srcs})
  target_sources(tfring_kernels PRIVATE ${_emu_kernel_srcs})
  target_sources(tfring_core PRIVATE ${_emu_runtime_srcs})
  target_include_directories(tfring_build_flags BEFORE INTERFACE
                             ${CMAKE_CURRENT_SOURCE_DIR}/tests/cuda_emu/include)
  target_compile_definitions(tfring_build_flags INTERFACE TFRING_HAVE_CUDA=1 TFRING_CUDA_EMULATION=1)
  # A fake NCCL (tests/cuda_emu/nccl/nccl.cc) for the product's NCCL backend:
  # <build>/nccl/libnccl.so.2, outside the package so that only
  # TFRING_NCCL_LIB finds it (tests/gpu_emu.sh sets it). It links
  # libtfring_core.so, whose already-loaded instance (same soname) it then
  # shares: the emulated streams the product made are the ones it queues on.
  add_library(tfring_emu_nccl SHARED ${CMAKE_CURRENT_SOURCE_DIR}/tests/cuda_emu/nccl/nccl.cc)
  target_include_directories(tfring_emu_nccl PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/tests/cuda_emu/include)
  target_link_libraries(tfring_emu_nccl PRIVATE tfring_core Threads::Threads rt)
  target_link_options(tfring_emu_nccl PRIVATE -Wl,--no-undefined)
  # NCCL's C API only (cmake/exports/emu_nccl.map; its functions carry no
  # visibility attributes, so they are compiled with default visibility).
  tfring_export_only(tfring_emu_nccl emu_nccl)
  set_target_properties(tfring_emu_nccl PROPERTIES
    OUTPUT_NAME nccl SOVERSION 2
    LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/nccl
    BUILD_RPATH "${TFRING_OUTPUT_DIR}")
  return()
endif()

if(NOT _cuda_mode STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(TFRING_HAVE_CUDA ON)
  elseif(_cuda_mode STREQUAL "ON")
    message(FATAL_ERROR "TFRING_WITH_CUDA=ON but no CUDA compiler (nvcc) was found; "
                        "put nvcc on the PATH or set CMAKE_CUDA_COMPILER")
  endif()
endif()

if(NOT TFRING_HAVE_CUDA)
  message(STATUS "tfring: CUDA not found or disabled, building CPU only")
  file(GLOB TFRING_NOCUDA_SRCS CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/csrc/gpu/nocuda/*.cc)
  target_sources(tfring_gpu PRIVATE ${TFRING_NOCUDA_SRCS})
  return()
endif()

enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)
# nvcc before 11.8 does not know sm_90: keep the default list buildable.
if(CMAKE_CUDA_COMPILER_VERSION VERSION_LESS 11.8 AND TFRING_CUDA_ARCHITECTURES STREQUAL "80-real;90")
  set(TFRING_CUDA_ARCHITECTURES "70-real;80")
endif()
message(STATUS "tfring: CUDA ${CUDAToolkit_VERSION} kernels for ${TFRING_CUDA_ARCHITECTURES} "
               "(${CMAKE_CUDA_COMPILER})")

# The kernels: an object library of their own (the CUDA half of the kernels
# layer, under the same layer check), so the C++ warning flags set for the
# whole directory (which nvcc would reject) can be replaced by their
# host-compiler equivalents.
file(GLOB TFRING_CUDA_KERNEL_SRCS CONFIGURE_DEPENDS
     ${CMAKE_CURRENT_SOURCE_DIR}/csrc/kernels/cuda/*.cu)
add_library(tfring_cuda_kernels OBJECT ${TFRING_CUDA_KERNEL_SRCS})
set_property(TARGET tfring_cuda_kernels PROPERTY COMPILE_OPTIONS "")
target_compile_options(tfring_cuda_kernels PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Wno-unused-parameter>)
target_include_directories(tfring_cuda_kernels PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/csrc)
set_target_properties(tfring_cuda_kernels PROPERTIES
  CUDA_ARCHITECTURES "${TFRING_CUDA_ARCHITECTURES}"
  CUDA_STANDARD 17
  CUDA_STANDARD_REQUIRED ON
  POSITION_INDEPENDENT_CODE ON
  CUDA_RUNTIME_LIBRARY Static)
add_dependencies(tfring_cuda_kernels tfring_layers)

file(GLOB TFRING_GPU_SRCS CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/csrc/gpu/cuda/*.cc)
target_sources(tfring_gpu PRIVATE ${TFRING_GPU_SRCS})
target_sources(tfring_core PRIVATE $<TARGET_OBJECTS:tfring_cuda_kernels>)
# Every core translation unit sees the CUDA headers and TFRING_HAVE_CUDA;
# tfring_core links the runtime.
target_compile_definitions(tfring_build_flags INTERFACE TFRING_HAVE_CUDA=1)
target_link_libraries(tfring_build_flags INTERFACE CUDA::cudart_static)
