# Tests beyond tests/test_*.c and tests/cuda_test_*.c; included from tests/tests.cmake.

# install_consumer: `cmake --install` into a scratch prefix (<build>/install_consumer/prefix), then build and run
# tests/consumer both through find_package(deft) and through `cc ... $(pkg-config --cflags --libs deft)`.
if(EXISTS ${PROJECT_SOURCE_DIR}/cmake/install.cmake)
  find_program(DEFT_BASH bash REQUIRED)
  add_test(NAME install_consumer
           COMMAND ${DEFT_BASH} ${PROJECT_SOURCE_DIR}/tests/consumer/run_consumer_test.sh
                   ${PROJECT_BINARY_DIR} ${PROJECT_SOURCE_DIR}/tests/consumer ${CMAKE_GENERATOR}
                   ${CMAKE_C_COMPILER} $<CONFIG>)
  set_tests_properties(install_consumer PROPERTIES
                       LABELS cpu
                       TIMEOUT 600
                       # it installs into and builds under the build tree: keep it apart from other builds of it
                       RESOURCE_LOCK deft_install_consumer
                       ENVIRONMENT "${DEFT_TEST_ENV}")
endif()
