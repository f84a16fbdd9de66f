# Runs one command and checks its exit status and what it printed: a program's refusals (a bad option, a run this
# machine cannot do) must be a chosen status and a message that says why, never a crash.
#   cmake "-DCOMMAND=prog|arg|..." -DEXIT=<status> "-DMATCH=<regex over stdout and stderr>" ["-DSET_ENV=A=1|--unset=B"]
#         -P tests/check_exit.cmake
# SET_ENV entries go to `cmake -E env` before the command (NAME=VALUE, or --unset=NAME).
string(REPLACE "|" ";" cmd "${COMMAND}")
set(envs "")
if(DEFINED SET_ENV AND NOT SET_ENV STREQUAL "")
  string(REPLACE "|" ";" envs "${SET_ENV}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E env ${envs} ${cmd} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE err TIMEOUT 120)
if(NOT "${rc}" STREQUAL "${EXIT}")
  message(FATAL_ERROR "${cmd}: exit ${rc}, want ${EXIT}\nstdout:\n${out}\nstderr:\n${err}")
endif()
if(NOT "${out}${err}" MATCHES "${MATCH}")
  message(FATAL_ERROR "${cmd}: exit ${rc} as wanted, but the output does not match '${MATCH}'\nstdout:\n${out}\n"
                      "stderr:\n${err}")
endif()
message(STATUS "${cmd}: exit ${rc}, output matches '${MATCH}'")
