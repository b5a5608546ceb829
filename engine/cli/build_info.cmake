# Writes OUT from IN with the git commit of SOURCE_DIR ("unknown" outside a git
# checkout). Run at every build; configure_file leaves OUT untouched when nothing
# changed, so only a new commit recompiles it.
#   cmake -DSOURCE_DIR=... -DIN=... -DOUT=... -DSWITCHYARD_VERSION=... -DBUILD_TYPE=...
#         -DCUDA=on|off -P build_info.cmake
execute_process(COMMAND git -C "${SOURCE_DIR}" rev-parse --short=12 HEAD
                OUTPUT_VARIABLE GIT_COMMIT OUTPUT_STRIP_TRAILING_WHITESPACE
                RESULT_VARIABLE git_failed ERROR_QUIET)
if(git_failed OR GIT_COMMIT STREQUAL "")
  set(GIT_COMMIT unknown)
endif()
configure_file("${IN}" "${OUT}" @ONLY)
