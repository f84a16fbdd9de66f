# Every tests/test_*.c is one ctest executable; tests/cuda_test_*.c carry the label `cuda` and skip (exit 77)
# where no GPU works. A test sees deft.h, testing/deft_testing.h and its own helpers in tests/, nothing internal.
file(GLOB DEFT_CPU_TESTS CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/tests/test_*.c)
file(GLOB DEFT_CUDA_TESTS CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/tests/cuda_test_*.c)

set(DEFT_TEST_ENV "")
if(DEFT_SANITIZE)
  # CUDA's runtime maps memory where ASan keeps its shadow gap.
  set(DEFT_TEST_ENV "ASAN_OPTIONS=protect_shadow_gap=0:detect_leaks=1;UBSAN_OPTIONS=print_stacktrace=1")
endif()

foreach(src ${DEFT_CPU_TESTS})
  get_filename_component(name ${src} NAME_WE)
  deft_add_program(${name} ${src} deft_testing)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  target_compile_definitions(${name} PRIVATE DEFT_TEST_DATA_DIR="${PROJECT_SOURCE_DIR}/tests/reference")
  add_test(NAME ${name} COMMAND ${name} WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(${name} PROPERTIES LABELS cpu SKIP_RETURN_CODE 77 TIMEOUT 600
                       ENVIRONMENT "${DEFT_TEST_ENV}")
endforeach()

foreach(src ${DEFT_CUDA_TESTS})
  get_filename_component(name ${src} NAME_WE)
  deft_add_program(${name} ${src} deft_testing)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  target_compile_definitions(${name} PRIVATE DEFT_TEST_DATA_DIR="${PROJECT_SOURCE_DIR}/tests/reference")
  add_test(NAME ${name} COMMAND ${name} WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(${name} PROPERTIES LABELS cuda SKIP_RETURN_CODE 77 TIMEOUT 600
                       ENVIRONMENT "${DEFT_TEST_ENV}")
endforeach()

# Each public header compiles on its own, with the library's warnings: one object per include/deft/*.h, built with
# the tests.
file(GLOB DEFT_PUBLIC_PARTS CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/include/deft/*.h)
set(DEFT_HEADER_CHECKS "")
foreach(header ${DEFT_PUBLIC_PARTS})
  get_filename_component(name ${header} NAME_WE)
  file(CONFIGURE OUTPUT ${PROJECT_BINARY_DIR}/header_check/${name}.c CONTENT "#include \"deft/${name}.h\"\n")
  list(APPEND DEFT_HEADER_CHECKS ${PROJECT_BINARY_DIR}/header_check/${name}.c)
endforeach()
add_library(deft_header_check OBJECT ${DEFT_HEADER_CHECKS})
target_link_libraries(deft_header_check PRIVATE deft)
target_compile_options(deft_header_check PRIVATE ${DEFT_C_WARNINGS})

# Tests and benchmarks include deft.h and deft_testing.h only, examples deft.h only (testing/check_includes.cmake).
add_test(NAME test_support_includes
         COMMAND ${CMAKE_COMMAND} -DDEFT_SOURCE_DIR=${PROJECT_SOURCE_DIR}
                 -P ${PROJECT_SOURCE_DIR}/testing/check_includes.cmake)
set_tests_properties(test_support_includes PROPERTIES LABELS cpu TIMEOUT 60)

# The layers: no include, and no call between the folders' objects, against the pipeline; no cycle.
add_test(NAME check_layers COMMAND ${PROJECT_SOURCE_DIR}/scripts/check_layers.sh ${CMAKE_BINARY_DIR})
set_tests_properties(check_layers PROPERTIES LABELS cpu TIMEOUT 120)

include(${PROJECT_SOURCE_DIR}/tests/extra_tests.cmake OPTIONAL)
