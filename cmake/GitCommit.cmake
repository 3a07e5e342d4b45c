# Writes OUT (a header defining STEPCAST_GIT_COMMIT) at every build, touching it
# only when the commit changed. The caller's environment variable
# STEPCAST_GIT_COMMIT wins: the GPU machine receives the working tree over the
# .git of an older commit, where `git rev-parse` answers, wrongly.
#   cmake -DSRC=<repo> -DOUT=<header> -P GitCommit.cmake
if(DEFINED ENV{STEPCAST_GIT_COMMIT})
  set(commit "$ENV{STEPCAST_GIT_COMMIT}")
else()
  execute_process(COMMAND git rev-parse --short HEAD WORKING_DIRECTORY ${SRC}
                  OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0 OR commit STREQUAL "")
    set(commit "unknown")
  else()
    execute_process(COMMAND git status --porcelain --untracked-files=no WORKING_DIRECTORY ${SRC}
                    OUTPUT_VARIABLE dirty OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(NOT dirty STREQUAL "")
      set(commit "${commit}+dirty")
    endif()
  endif()
endif()
set(text "#pragma once\n#define STEPCAST_GIT_COMMIT \"${commit}\"\n")
if(EXISTS ${OUT})
  file(READ ${OUT} old)
endif()
if(NOT old STREQUAL text)
  file(WRITE ${OUT} "${text}")
endif()
