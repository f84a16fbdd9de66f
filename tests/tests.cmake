# Every tests/test_*.c is one ctest executable; tests/cuda_test_*.c carry the label `cuda` and skip (exit 77)
# where no GPU works.
file(GLOB DEFT_CPU_TESTS CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/tests/test_*.c)
file(GLOB DEFT_CUDA_TESTS CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/tests/cuda_test_*.c)

set(DEFT_TEST_ENV "")
if(DEFT_SANITIZE)
  # CUDA's runtime maps memory where ASan keeps its shadow gap.
  set(DEFT_TEST_ENV "ASAN_OPTIONS=protect_shadow_gap=0:detect_leaks=1;UBSAN_OPTIONS=print_stacktrace=1")
endif()

foreach(src ${DEFT_CPU_TESTS})
  get_filename_component(name ${src} NAME_WE)
  deft_add_program(${name} ${src})
  add_test(NAME ${name} COMMAND ${name} WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(${name} PROPERTIES LABELS cpu SKIP_RETURN_CODE 77 TIMEOUT 600
                       ENVIRONMENT "${DEFT_TEST_ENV}")
endforeach()

foreach(src ${DEFT_CUDA_TESTS})
  get_filename_component(name ${src} NAME_WE)
  deft_add_program(${name} ${src})
  add_test(NAME ${name} COMMAND ${name} WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(${name} PROPERTIES LABELS cuda SKIP_RETURN_CODE 77 TIMEOUT 600
                       ENVIRONMENT "${DEFT_TEST_ENV}")
endforeach()

include(${PROJECT_SOURCE_DIR}/tests/extra_tests.cmake OPTIONAL)
