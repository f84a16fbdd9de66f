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

# The training examples, run to the end: the loss of the linear regression must fall to the noise floor, and the
# MLP must classify the generated MNIST-format test set (written by the example itself) at over 90%.
if(DEFT_BUILD_EXAMPLES)
  add_test(NAME example_linear_regression COMMAND linear_regression 100)
  set_tests_properties(example_linear_regression PROPERTIES LABELS cpu TIMEOUT 300
                       PASS_REGULAR_EXPRESSION "epoch 100  loss 0\\.0000[0-9]+ .*learned b: 0\\.70"
                       ENVIRONMENT "${DEFT_TEST_ENV}")
  set(DEFT_MNIST_DIR ${PROJECT_BINARY_DIR}/mnist_synthetic)
  file(MAKE_DIRECTORY ${DEFT_MNIST_DIR})
  add_test(NAME example_mnist_mlp COMMAND mnist_mlp ${DEFT_MNIST_DIR} --synthetic 3000 --epochs 2)
  set_tests_properties(example_mnist_mlp PROPERTIES LABELS cpu TIMEOUT 300
                       PASS_REGULAR_EXPRESSION "epoch 2  test accuracy (9[0-9]|100)\\."
                       ENVIRONMENT "${DEFT_TEST_ENV}")
endif()

# cuda_test_norm_pool with the CPU standing in for the GPU: batch norm in f16/bf16 with f32 statistics on the CPU
# against its f32 result and the textbook running statistics, wherever ctest runs.
add_test(NAME norm_pool_on_cpu COMMAND cuda_test_norm_pool WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
set_tests_properties(norm_pool_on_cpu PROPERTIES LABELS cpu TIMEOUT 600
                     ENVIRONMENT "DEFT_TEST_GPU_AS_CPU=1;${DEFT_TEST_ENV}")
