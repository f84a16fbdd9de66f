# Every example and bench executable answers --help and -h on stdout with exit 0, its text naming "usage" and the
# program, and answers an unknown option with its usage on stderr and exit 2.
#   cmake -DPROGRAMS=path1|path2|... -P check_help.cmake
string(REPLACE "|" ";" programs "${PROGRAMS}")
set(failures 0)
foreach(exe IN LISTS programs)
  get_filename_component(name "${exe}" NAME_WE)
  foreach(flag --help -h)
    execute_process(COMMAND "${exe}" ${flag} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                    TIMEOUT 60)
    string(TOLOWER "${out}" lower)
    if(NOT rc EQUAL 0 OR NOT lower MATCHES "usage" OR NOT out MATCHES "${name}")
      message(SEND_ERROR "${name} ${flag}: exit ${rc}, stdout:\n${out}\nstderr:\n${err}")
      math(EXPR failures "${failures} + 1")
    endif()
  endforeach()
  execute_process(COMMAND "${exe}" --no-such-option RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                  TIMEOUT 60)
  if(NOT rc EQUAL 2 OR NOT err MATCHES "usage")
    message(SEND_ERROR "${name} --no-such-option: exit ${rc} (want 2 and the usage on stderr), stderr:\n${err}")
    math(EXPR failures "${failures} + 1")
  endif()
endforeach()
list(LENGTH programs n)
if(failures)
  message(FATAL_ERROR "${failures} check(s) failed over ${n} programs")
endif()
message(STATUS "${n} programs answer --help, -h and a bad option")
