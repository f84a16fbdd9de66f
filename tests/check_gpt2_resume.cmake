# example_gpt2_resume: gpt2_train run 16 steps saving its state at step 8, then run again resumed from that state:
# the losses of steps 9 to 16 and the validation loss must be the same text, as from an uninterrupted run.
#   cmake -DPROGRAM=<gpt2_train> -DWORK=<dir> -P tests/check_gpt2_resume.cmake
cmake_minimum_required(VERSION 3.24)
file(MAKE_DIRECTORY ${WORK})
set(args --device cpu --layers 1 --width 32 --seq 32 --batch 4 --steps 16 --log-every 1 --val-every 0
         --val-batches 1 --sample 0)
execute_process(COMMAND ${PROGRAM} ${args} --state ${WORK}/state --save-every 8
                RESULT_VARIABLE rc_a OUTPUT_VARIABLE out_a ERROR_VARIABLE err_a)
if(NOT rc_a EQUAL 0)
  message(FATAL_ERROR "the uninterrupted run failed (${rc_a}):\n${out_a}${err_a}")
endif()
execute_process(COMMAND ${PROGRAM} ${args} --resume ${WORK}/state.step8
                RESULT_VARIABLE rc_b OUTPUT_VARIABLE out_b ERROR_VARIABLE err_b)
if(NOT rc_b EQUAL 0)
  message(FATAL_ERROR "the resumed run failed (${rc_b}):\n${out_b}${err_b}")
endif()
if(NOT out_b MATCHES "resumed from [^\n]* at step 8")
  message(FATAL_ERROR "the resumed run did not start at step 8:\n${out_b}")
endif()
# The loss lines without their rate (tokens/s differ from run to run).
function(loss_lines text out)
  string(REGEX MATCHALL "step (9|1[0-6])/16  loss [0-9.]+  lr [0-9.e-]+|validation loss [0-9.]+" lines "${text}")
  set(${out} "${lines}" PARENT_SCOPE)
endfunction()
loss_lines("${out_a}" a)
loss_lines("${out_b}" b)
list(LENGTH a n)
if(NOT n EQUAL 9 OR NOT a STREQUAL b)
  message(FATAL_ERROR "resumed losses differ (${n} lines):\nuninterrupted: ${a}\nresumed:       ${b}")
endif()
message(STATUS "steps 9-16 and the validation loss are the same after the resume: ${b}")
