# The include rule of tests and benchmarks, run as the ctest `test_support_includes`: of deft's headers they include
# deft.h and testing/deft_testing.h only (beside their own helpers in tests/ and bench/, examples/resnet18.h and
# examples/gpt2.h).
# The include directories already keep the internal folders out of reach; this also catches a relative path into
# them. Examples include deft.h alone.
#   cmake -DDEFT_SOURCE_DIR=<source dir> -P testing/check_includes.cmake
cmake_minimum_required(VERSION 3.24)
file(GLOB _own RELATIVE ${DEFT_SOURCE_DIR}/tests ${DEFT_SOURCE_DIR}/tests/*.h)
file(GLOB _bench_own RELATIVE ${DEFT_SOURCE_DIR}/bench ${DEFT_SOURCE_DIR}/bench/*.h)
file(GLOB _example_own RELATIVE ${DEFT_SOURCE_DIR}/examples ${DEFT_SOURCE_DIR}/examples/*.h)
set(_bad "")

# Appends to _bad every quoted include of `file` that is not in the allowed list.
function(deft_check_file file)
  file(STRINGS ${file} _lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
  set(_allowed ${ARGN})
  foreach(_line ${_lines})
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([^\"]*)\".*" "\\1" _inc "${_line}")
    if(NOT _inc IN_LIST _allowed)
      set(_bad "${_bad}\n  ${file}: ${_inc}" PARENT_SCOPE)
    endif()
  endforeach()
endfunction()

file(GLOB _tests ${DEFT_SOURCE_DIR}/tests/*.c ${DEFT_SOURCE_DIR}/tests/*.h)
foreach(_f ${_tests})
  deft_check_file(${_f} deft.h deft_testing.h ../examples/resnet18.h ../examples/gpt2.h ${_own})
endforeach()
file(GLOB _benches ${DEFT_SOURCE_DIR}/bench/*.c ${DEFT_SOURCE_DIR}/bench/*.h)
foreach(_f ${_benches})
  deft_check_file(${_f} deft.h deft_testing.h ../examples/resnet18.h ../examples/gpt2.h ${_bench_own})
endforeach()
file(GLOB _examples ${DEFT_SOURCE_DIR}/examples/*.c ${DEFT_SOURCE_DIR}/examples/*.h)
foreach(_f ${_examples})
  deft_check_file(${_f} deft.h ${_example_own})
endforeach()

if(_bad)
  message(FATAL_ERROR "includes of internal headers (use deft.h and testing/deft_testing.h):${_bad}")
endif()
message(STATUS "tests, benchmarks and examples include deft.h (and deft_testing.h) only")
