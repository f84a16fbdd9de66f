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

# first_hour: the README followed from a fresh clone of the last commit in a temporary folder (tests/first_hour.sh):
# setup.sh CPU-only, the install used through CMake and pkg-config, mnist_mlp into a new directory, --help everywhere.
# Not under the sanitizers: it builds a plain copy of its own.
if(NOT DEFT_SANITIZE)
  find_program(DEFT_BASH bash REQUIRED)
  add_test(NAME first_hour COMMAND ${DEFT_BASH} ${PROJECT_SOURCE_DIR}/tests/first_hour.sh ${PROJECT_SOURCE_DIR}
                                   ${CMAKE_C_COMPILER})
  set_tests_properties(first_hour PROPERTIES LABELS cpu TIMEOUT 1500 SKIP_RETURN_CODE 77)
endif()

# The training examples, run to the end: the loss of the linear regression must fall to the noise floor, and the
# MLP must classify the generated MNIST-format test set (written by the example itself) at over 90%.
# A gpt2_train run with the arguments after MATCH that must exit 2 saying MATCH (a regular expression).
function(deft_gpt2_train_refused name match)
  list(JOIN ARGN "|" args)
  add_test(NAME ${name}
           COMMAND ${CMAKE_COMMAND} "-DCOMMAND=$<TARGET_FILE:gpt2_train>|${args}" -DEXIT=2 "-DMATCH=${match}"
                   -P ${PROJECT_SOURCE_DIR}/tests/check_exit.cmake)
  set_tests_properties(${name} PROPERTIES LABELS cpu TIMEOUT 60 ENVIRONMENT "${DEFT_TEST_ENV}")
endfunction()

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
  # --synthetic into a directory that does not exist yet (two levels of it), as the README's first run does: the
  # example creates it. The fixture removes what an earlier run left.
  set(DEFT_MNIST_NEW_DIR ${PROJECT_BINARY_DIR}/mnist_new_dir)
  add_test(NAME example_mnist_mlp_new_dir_clean COMMAND ${CMAKE_COMMAND} -E rm -rf ${DEFT_MNIST_NEW_DIR})
  set_tests_properties(example_mnist_mlp_new_dir_clean PROPERTIES LABELS cpu FIXTURES_SETUP deft_mnist_new_dir)
  add_test(NAME example_mnist_mlp_new_dir
           COMMAND mnist_mlp ${DEFT_MNIST_NEW_DIR}/data --synthetic 600 --epochs 1)
  set_tests_properties(example_mnist_mlp_new_dir PROPERTIES LABELS cpu TIMEOUT 300
                       FIXTURES_REQUIRED deft_mnist_new_dir
                       PASS_REGULAR_EXPRESSION "epoch 1  test accuracy"
                       ENVIRONMENT "${DEFT_TEST_ENV}")
  # GPT-2's example on the CPU, small: it trains on the default text (or says it is missing), validates and samples.
  add_test(NAME example_gpt2_train COMMAND gpt2_train --device cpu --layers 2 --width 64 --seq 64 --batch 8
                                           --steps 60 --log-every 20 --val-every 0 --val-batches 2 --sample 40)
  set_tests_properties(example_gpt2_train PROPERTIES LABELS cpu TIMEOUT 300
                       PASS_REGULAR_EXPRESSION "step 60/60  loss [0-9.]+.*validation loss [0-9.]+.*sample:"
                       ENVIRONMENT "${DEFT_TEST_ENV}")
  # The loss over row blocks, reordered so that each block's logits die after its gradient: it trains, and a count
  # of blocks not dividing batch x seq is refused with the numbers (the same bits: test_gpt2_loss_chunks).
  add_test(NAME example_gpt2_train_loss_chunks COMMAND gpt2_train --device cpu --layers 2 --width 64 --seq 64 --batch 8
                                                --steps 10 --log-every 10 --val-every 0 --val-batches 1 --sample 0
                                                --loss-chunks 4 --reorder)
  set_tests_properties(example_gpt2_train_loss_chunks PROPERTIES LABELS cpu TIMEOUT 300
                       PASS_REGULAR_EXPRESSION "step 10/10  loss [0-9.]+" ENVIRONMENT "${DEFT_TEST_ENV}")
  deft_gpt2_train_refused(example_gpt2_train_loss_chunks_refused
                          "--loss-chunks 3 must be at least 1 and divide batch x seq \\(8 x 128\\)"
                          --device cpu --layers 2 --loss-chunks 3)
  # The optimizer's bf16 copies of the weights read in place of casts (the same bits: test_param_copies).
  add_test(NAME example_gpt2_train_param_copies COMMAND gpt2_train --device cpu --autocast bf16 --layers 2 --width 64
                                                 --seq 64 --batch 8 --steps 10 --log-every 10 --val-every 0
                                                 --val-batches 1 --sample 0 --param-copies)
  set_tests_properties(example_gpt2_train_param_copies PROPERTIES LABELS cpu TIMEOUT 300
                       PASS_REGULAR_EXPRESSION "step 10/10  loss [0-9.]+" ENVIRONMENT "${DEFT_TEST_ENV}")
  # A value the example does not take is named (the usage line alone did not say which one was wrong).
  deft_gpt2_train_refused(example_gpt2_train_bad_value
                          "--steps, --batch, --log-every and --val-batches must be at least 1"
                          --device cpu --val-batches 0)
  deft_gpt2_train_refused(example_gpt2_train_bad_model "--model 355M: an unknown option or a value it does not take"
                          --device cpu --model 355M)
  # Stopped at step 8 and resumed from its saved state, the example gives the same losses as an uninterrupted run.
  add_test(NAME example_gpt2_resume
           COMMAND ${CMAKE_COMMAND} -DPROGRAM=$<TARGET_FILE:gpt2_train> -DWORK=${PROJECT_BINARY_DIR}/gpt2_resume
                   -P ${PROJECT_SOURCE_DIR}/tests/check_gpt2_resume.cmake)
  set_tests_properties(example_gpt2_resume PROPERTIES LABELS cpu TIMEOUT 300 ENVIRONMENT "${DEFT_TEST_ENV}")
  # Under ctest stdout is no terminal: progress must come as whole lines, never redrawn with '\r'.
  set_tests_properties(example_linear_regression example_mnist_mlp example_mnist_mlp_new_dir example_gpt2_train PROPERTIES
                       FAIL_REGULAR_EXPRESSION "\r")
endif()

# Every example and bench executable answers --help and -h (exit 0, usage and its name on stdout) and a bad option
# (exit 2, usage on stderr): tests/check_help.cmake.
set(DEFT_HELP_PROGRAMS "")
foreach(src ${DEFT_EXAMPLES} ${DEFT_BENCHES})
  get_filename_component(name ${src} NAME_WE)
  if(TARGET ${name})
    list(APPEND DEFT_HELP_PROGRAMS "$<TARGET_FILE:${name}>")
  endif()
endforeach()
if(DEFT_HELP_PROGRAMS)
  list(JOIN DEFT_HELP_PROGRAMS "|" DEFT_HELP_ARG)
  add_test(NAME programs_help
           COMMAND ${CMAKE_COMMAND} "-DPROGRAMS=${DEFT_HELP_ARG}" -P ${PROJECT_SOURCE_DIR}/tests/check_help.cmake)
  set_tests_properties(programs_help PROPERTIES LABELS cpu TIMEOUT 300 ENVIRONMENT "${DEFT_TEST_ENV}")
endif()

# cuda_test_norm_pool with the CPU standing in for the GPU: batch norm in f16/bf16 with f32 statistics on the CPU
# against its f32 result and the textbook running statistics, wherever ctest runs.
add_test(NAME norm_pool_on_cpu COMMAND cuda_test_norm_pool WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
set_tests_properties(norm_pool_on_cpu PROPERTIES LABELS cpu TIMEOUT 600
                     ENVIRONMENT "DEFT_TEST_GPU_AS_CPU=1;${DEFT_TEST_ENV}")

# Why the cuda-labelled tests skip, where ctest's summary shows it: the last test, named for what those tests need,
# passes where they run and is listed with them as "(Skipped)" where they skip; its output (and setup.sh's closing
# lines, which run it) gives the reason: no usable GPU, or a build without CUDA.
deft_add_program(gpu_check ${PROJECT_SOURCE_DIR}/tests/gpu_check.c)
list(LENGTH DEFT_CUDA_TESTS _deft_cuda_test_count)
if(DEFT_HAVE_CUDA)
  set(_deft_gpu_check_test cuda_tests_need_a_gpu)
else()
  set(_deft_gpu_check_test cuda_tests_need_a_cuda_build)
endif()
add_test(NAME ${_deft_gpu_check_test} COMMAND gpu_check ${_deft_cuda_test_count})
set_tests_properties(${_deft_gpu_check_test} PROPERTIES LABELS cuda SKIP_RETURN_CODE 77 TIMEOUT 60
                     ENVIRONMENT "${DEFT_TEST_ENV}")

# An example's --trace (deft_program_trace): the file is written, and holds a trace's events. The fixture removes
# what an earlier run left, so an old file cannot pass for a new one.
if(DEFT_BUILD_EXAMPLES)
  set(DEFT_TRACE_FILE ${PROJECT_BINARY_DIR}/example_trace.json)
  add_test(NAME example_trace_clean COMMAND ${CMAKE_COMMAND} -E rm -f ${DEFT_TRACE_FILE})
  set_tests_properties(example_trace_clean PROPERTIES LABELS cpu FIXTURES_SETUP deft_trace_clean)
  add_test(NAME example_linear_regression_trace COMMAND linear_regression 2 --trace ${DEFT_TRACE_FILE})
  set_tests_properties(example_linear_regression_trace PROPERTIES LABELS cpu TIMEOUT 120
                       FIXTURES_REQUIRED deft_trace_clean FIXTURES_SETUP deft_trace_written
                       PASS_REGULAR_EXPRESSION "trace of one more step written to"
                       ENVIRONMENT "${DEFT_TEST_ENV}")
  add_test(NAME example_trace_file COMMAND ${CMAKE_COMMAND} -E cat ${DEFT_TRACE_FILE})
  set_tests_properties(example_trace_file PROPERTIES LABELS cpu FIXTURES_REQUIRED deft_trace_written
                       PASS_REGULAR_EXPRESSION "\"traceEvents\":\\[.*\"ph\":\"X\".*\"displayTimeUnit\":\"ms\"")
endif()

# scripts/text_to_tokens.py on a small text, its shards read back by the C reader (test_tokens --check-converted);
# skips, saying why, without python3.
find_program(DEFT_BASH bash REQUIRED)
add_test(NAME text_to_tokens
         COMMAND ${DEFT_BASH} ${PROJECT_SOURCE_DIR}/tests/text_to_tokens_test.sh ${PROJECT_SOURCE_DIR}
                 $<TARGET_FILE:test_tokens> ${PROJECT_BINARY_DIR}/text_to_tokens)
set_tests_properties(text_to_tokens PROPERTIES LABELS cpu TIMEOUT 120 SKIP_RETURN_CODE 77
                     ENVIRONMENT "${DEFT_TEST_ENV}")

# scripts/graph_gaps.py on a made-up kernel trace (bench/kernel_trace.c's lines): windows, gaps, the slower window,
# a truncated line refused. Skips, saying why, without python3.
add_test(NAME graph_gaps
         COMMAND ${DEFT_BASH} ${PROJECT_SOURCE_DIR}/tests/graph_gaps_test.sh ${PROJECT_SOURCE_DIR}
                 ${PROJECT_BINARY_DIR}/graph_gaps)
set_tests_properties(graph_gaps PROPERTIES LABELS cpu TIMEOUT 60 SKIP_RETURN_CODE 77)

# scripts/deft_launch on small shell commands (ranks' variables, prefixed output, a failing, a killed and a hanging
# rank, SIGTERM passed on, bad options), and test_dist_env --print under it (the library reads what it sets).
add_test(NAME deft_launch
         COMMAND ${DEFT_BASH} ${PROJECT_SOURCE_DIR}/tests/deft_launch_test.sh ${PROJECT_SOURCE_DIR}
                 ${PROJECT_BINARY_DIR}/deft_launch_test $<TARGET_FILE:test_dist_env>)
set_tests_properties(deft_launch PROPERTIES LABELS cpu TIMEOUT 120 ENVIRONMENT "${DEFT_TEST_ENV}")

# Refusals of the data-parallel programs on a machine without GPUs (tests/check_exit.cmake: the exit status and the
# message): bench_ddp --model gpt2's bad sizes (exit 2) and its skip where no GPU is visible (exit 0), gpt2_train
# under a launcher's variables without a GPU (exit 1, saying why), --zero alone and --device under a launcher (exit
# 2). CUDA_VISIBLE_DEVICES is emptied so that a GPU host answers as one without GPUs.
set(DEFT_CHECK_EXIT ${PROJECT_SOURCE_DIR}/tests/check_exit.cmake)
set(DEFT_NO_LAUNCHER "--unset=RANK|--unset=WORLD_SIZE|--unset=OMPI_COMM_WORLD_RANK|--unset=OMPI_COMM_WORLD_SIZE|--unset=PMI_RANK|--unset=PMI_SIZE")
if(TARGET bench_ddp)
  add_test(NAME bench_ddp_gpt2_bad_batch
           COMMAND ${CMAKE_COMMAND} "-DCOMMAND=$<TARGET_FILE:bench_ddp>|--model|gpt2|--batch|0" -DEXIT=2
                   "-DMATCH=--batch 0: want an integer" -P ${DEFT_CHECK_EXIT})
  add_test(NAME bench_ddp_gpt2_sizes_need_gpt2
           COMMAND ${CMAKE_COMMAND} "-DCOMMAND=$<TARGET_FILE:bench_ddp>|--model|mlp|--layers|2" -DEXIT=2
                   "-DMATCH=are for --model gpt2" -P ${DEFT_CHECK_EXIT})
  add_test(NAME bench_ddp_gpt2_efficiency_needs_gpus
           COMMAND ${CMAKE_COMMAND} "-DCOMMAND=$<TARGET_FILE:bench_ddp>|--model|gpt2|--efficiency" -DEXIT=2
                   "-DMATCH=--efficiency compares N > 1 GPUs" -P ${DEFT_CHECK_EXIT})
  add_test(NAME bench_ddp_gpt2_skips_without_gpus
           COMMAND ${CMAKE_COMMAND} "-DCOMMAND=$<TARGET_FILE:bench_ddp>|--model|gpt2|--zero|--gpus|2|--layers|2"
                   -DEXIT=0 "-DMATCH=ddp.gpt2_l2_t1024_b16_bf16 needs NCCL and 2 GPUs \\(0 visible\\): skipped"
                   "-DSET_ENV=CUDA_VISIBLE_DEVICES=" -P ${DEFT_CHECK_EXIT})
  set_tests_properties(bench_ddp_gpt2_bad_batch bench_ddp_gpt2_sizes_need_gpt2 bench_ddp_gpt2_efficiency_needs_gpus
                       bench_ddp_gpt2_skips_without_gpus PROPERTIES LABELS cpu TIMEOUT 150
                       ENVIRONMENT "${DEFT_TEST_ENV}")
endif()
if(DEFT_BUILD_EXAMPLES)
  add_test(NAME example_gpt2_train_launcher_needs_gpu
           COMMAND ${CMAKE_COMMAND} "-DCOMMAND=$<TARGET_FILE:gpt2_train>|--layers|2|--steps|2" -DEXIT=1
                   "-DMATCH=one rank of a data-parallel world .*needs NCCL and a GPU per rank: "
                   "-DSET_ENV=CUDA_VISIBLE_DEVICES=|RANK=0|WORLD_SIZE=1|LOCAL_RANK=0|MASTER_ADDR=127.0.0.1|MASTER_PORT=29511"
                   -P ${DEFT_CHECK_EXIT})
  add_test(NAME example_gpt2_train_zero_needs_launcher
           COMMAND ${CMAKE_COMMAND} "-DCOMMAND=$<TARGET_FILE:gpt2_train>|--device|cpu|--layers|2|--zero" -DEXIT=2
                   "-DMATCH=--zero shards the optimizer's state over the ranks" "-DSET_ENV=${DEFT_NO_LAUNCHER}"
                   -P ${DEFT_CHECK_EXIT})
  add_test(NAME example_gpt2_train_reduce_bf16_needs_launcher
           COMMAND ${CMAKE_COMMAND} "-DCOMMAND=$<TARGET_FILE:gpt2_train>|--device|cpu|--layers|2|--reduce-bf16"
                   -DEXIT=2 "-DMATCH=--reduce-bf16 averages the gradients over the ranks of a launcher's world"
                   "-DSET_ENV=${DEFT_NO_LAUNCHER}" -P ${DEFT_CHECK_EXIT})
  add_test(NAME example_gpt2_train_launcher_no_device
           COMMAND ${CMAKE_COMMAND} "-DCOMMAND=$<TARGET_FILE:gpt2_train>|--device|cpu|--layers|2" -DEXIT=2
                   "-DMATCH=--device: under a launcher .*leave --device out"
                   "-DSET_ENV=RANK=0|WORLD_SIZE=1|MASTER_ADDR=127.0.0.1|MASTER_PORT=29512" -P ${DEFT_CHECK_EXIT})
  set_tests_properties(example_gpt2_train_launcher_needs_gpu example_gpt2_train_zero_needs_launcher
                       example_gpt2_train_reduce_bf16_needs_launcher example_gpt2_train_launcher_no_device PROPERTIES LABELS cpu TIMEOUT 150
                       ENVIRONMENT "${DEFT_TEST_ENV}")
endif()
# bench/peers/ddp.py's refusals parse without PyTorch: GPT-2's options with another model.
find_program(DEFT_PYTHON3 python3)
if(DEFT_PYTHON3)
  add_test(NAME ddp_peer_zero_needs_gpt2
           COMMAND ${CMAKE_COMMAND} "-DCOMMAND=${DEFT_PYTHON3}|${PROJECT_SOURCE_DIR}/bench/peers/ddp.py|--model|mlp|--zero"
                   -DEXIT=2 "-DMATCH=--zero: for --model gpt2" -P ${DEFT_CHECK_EXIT})
  add_test(NAME ddp_peer_bf16_hook_needs_bf16
           COMMAND ${CMAKE_COMMAND}
                   "-DCOMMAND=${DEFT_PYTHON3}|${PROJECT_SOURCE_DIR}/bench/peers/ddp.py|--model|gpt2|--precision|f32|--bf16-hook"
                   -DEXIT=2 "-DMATCH=--bf16-hook averages bf16 gradients: with --precision bf16" -P ${DEFT_CHECK_EXIT})
  set_tests_properties(ddp_peer_zero_needs_gpt2 ddp_peer_bf16_hook_needs_bf16 PROPERTIES LABELS cpu TIMEOUT 60)
endif()
# gpt2_train under scripts/deft_launch on two GPUs (plain and --zero): progress from rank 0 only, a state file per
# rank, and the resumed run's losses equal to the uninterrupted run's. Skips with fewer than two GPUs or no NCCL.
if(DEFT_BUILD_EXAMPLES)
  add_test(NAME example_gpt2_train_launch
           COMMAND ${DEFT_BASH} ${PROJECT_SOURCE_DIR}/tests/gpt2_train_launch_test.sh ${PROJECT_SOURCE_DIR}
                   ${PROJECT_BINARY_DIR}/gpt2_train_launch $<TARGET_FILE:gpt2_train>)
  set_tests_properties(example_gpt2_train_launch PROPERTIES LABELS cuda TIMEOUT 600 SKIP_RETURN_CODE 77
                       ENVIRONMENT "${DEFT_TEST_ENV}")
endif()
