# Symbol hygiene: every library exports only its API.
#
# tfring_export_only(<target> <map>) links <target> with the linker version
# script cmake/exports/<map>.map (what it exports; everything else local)
# and --exclude-libs,ALL (nothing of a static archive linked into it, such
# as libstdc++.a under -static-libstdc++ or the static CUDA runtime, is
# exported even if a pattern matched it).
#
# Why: libstdc++'s headers give std:: templates default visibility even
# under -fvisibility=hidden, so a library exports every std:: function it
# instantiates, and with a statically linked libstdc++ all of it. In a
# process that loaded the system libstdc++.so.6 first (CuPy, PyTorch,
# TensorFlow do), the dynamic linker then binds some of the library's calls
# to that runtime and some to its own copy, and mixing the two crashes.
# tests/core/test_symbols.py checks every built library and runs a job with a
# -static-libstdc++ core after the system runtime was loaded.
function(tfring_export_only target map)
  set(_map ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/exports/${map}.map)
  target_link_options(${target} PRIVATE
    "LINKER:--version-script=${_map}" "LINKER:--exclude-libs,ALL")
  set_property(TARGET ${target} APPEND PROPERTY LINK_DEPENDS ${_map})
endfunction()
