# urewrite.cmake: urewrite_instrument(), a build step that writes a probed copy of a target.
#
# Reached through find_package(urewrite) (urewriteConfig.cmake includes this file), or directly:
#     include("<the folder that `urewrite --cmake-dir` prints>/urewrite.cmake")
#
#     urewrite_instrument(<target>
#         [PROBES spec...]        function names, globs ("parse_*") or addresses: urewrite -p
#         [RETURN function...]    return probes: urewrite -r
#         [USDT provider:name...] USDT probes: urewrite -p usdt:provider:name
#         [OUTPUT file]           default <target>.probed, beside the target's own file;
#                                 a relative path is taken from the target's output folder
#         [TARGET name]           the new target, default <target>_probed
#         [KEEP_GOING]            urewrite --keep-going
#         [PROGRAM file]          a probe program (bpftrace's language) built into the probes,
#                                 with the probes it names: urewrite -f (docs/programs.md)
#         [CALL file.c:function]  a C callback built into every probe: urewrite --call
#                                 (a relative file is taken from the current source folder;
#                                 the rewrite re-runs when the program or the C file changes)
#         [OPTIONS arg...]        further urewrite arguments, passed as given
#         [EXCLUDE_FROM_ALL])     do not build it with the default target
#
# The new target runs urewrite after <target> links; <target> itself stays untouched. The rewrite
# re-runs when the input file changes or the urewrite command line does (probes, output, the
# urewrite program or its version), and not otherwise. When urewrite fails (a probe that cannot be
# placed, say) the build fails with urewrite's one-line message and no output file is written.
# The new target has the properties UREWRITE_OUTPUT (the file written) and UREWRITE_SOURCE_TARGET.
#
# How urewrite is run: the cache variable UREWRITE_EXECUTABLE, when set, is the program, or a
# command as a list ("/usr/bin/python3;-m;urewrite"). Otherwise: the `urewrite` program next to
# ${Python3_EXECUTABLE} or ${Python_EXECUTABLE} (when the project found Python first), that
# interpreter's `-m urewrite`, the `urewrite` program on PATH, `python3 -m urewrite` on PATH.
# Each candidate is checked at configure time with `--version`; the first of the same version as
# this module wins (else the first that runs, with a warning). UREWRITE_COMMAND and
# UREWRITE_VERSION hold the outcome.

include_guard(GLOBAL)

if(CMAKE_VERSION VERSION_LESS 3.13)
  message(FATAL_ERROR "urewrite: urewrite_instrument needs CMake 3.13 or newer")
endif()

set(_UREWRITE_MODULE_DIR "${CMAKE_CURRENT_LIST_DIR}")

# The version of the urewrite package this file ships in (its __init__.py, two folders up).
set(_UREWRITE_MODULE_VERSION "")
if(EXISTS "${_UREWRITE_MODULE_DIR}/../../__init__.py")
  file(STRINGS "${_UREWRITE_MODULE_DIR}/../../__init__.py" _urewrite_line
       REGEX "^__version__ *= *[\"'][^\"']+[\"']")
  string(REGEX REPLACE "^__version__ *= *[\"']([^\"']+)[\"'].*" "\\1"
         _UREWRITE_MODULE_VERSION "${_urewrite_line}")
endif()

set(UREWRITE_EXECUTABLE "" CACHE STRING
    "The urewrite program, or a command list such as /usr/bin/python3;-m;urewrite (empty: search)")

# Finds the urewrite command: sets UREWRITE_COMMAND (a list) and UREWRITE_VERSION, or leaves
# UREWRITE_COMMAND empty and says why in UREWRITE_NOT_FOUND_REASON. Among the candidates, the
# first whose version is that of this module wins, else the first that runs at all.
function(_urewrite_find)
  set(pythons)
  foreach(var Python3_EXECUTABLE Python_EXECUTABLE PYTHON_EXECUTABLE)
    if(${var})
      list(APPEND pythons "${${var}}")
    endif()
  endforeach()

  # Each candidate is a command with "|" for ";" (a list inside the list).
  set(candidates)
  if(NOT UREWRITE_EXECUTABLE STREQUAL "")  # (a value such as "false" is a program too)
    string(REPLACE ";" "|" candidate "${UREWRITE_EXECUTABLE}")
    list(APPEND candidates "${candidate}")
  else()
    set(n 0)
    foreach(python IN LISTS pythons)
      get_filename_component(bindir "${python}" DIRECTORY)
      math(EXPR n "${n} + 1")
      find_program(_urewrite_program_${n} NAMES urewrite HINTS "${bindir}" NO_DEFAULT_PATH)
      if(_urewrite_program_${n})
        list(APPEND candidates "${_urewrite_program_${n}}")
      endif()
      unset(_urewrite_program_${n} CACHE)
    endforeach()
    foreach(python IN LISTS pythons)
      list(APPEND candidates "${python}|-m|urewrite")
    endforeach()
    find_program(_urewrite_program NAMES urewrite)
    if(_urewrite_program)
      list(APPEND candidates "${_urewrite_program}")
    endif()
    unset(_urewrite_program CACHE)
    find_program(_urewrite_python NAMES python3)
    if(_urewrite_python)
      list(APPEND candidates "${_urewrite_python}|-m|urewrite")
    endif()
    unset(_urewrite_python CACHE)
  endif()

  set(reason "no urewrite program was found: install the urewrite Python package, or set UREWRITE_EXECUTABLE")
  set(found "")
  foreach(candidate IN LISTS candidates)
    string(REPLACE "|" ";" command "${candidate}")
    execute_process(COMMAND ${command} --version
                    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                    OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_STRIP_TRAILING_WHITESPACE)
    if(rc EQUAL 0 AND out MATCHES "urewrite, version ([^ \n]+)")
      set(version "${CMAKE_MATCH_1}")
      if(NOT found)
        set(found "${candidate}")
        set(found_version "${version}")
      endif()
      if(NOT _UREWRITE_MODULE_VERSION OR version STREQUAL _UREWRITE_MODULE_VERSION)
        set(found "${candidate}")
        set(found_version "${version}")
        break()
      endif()
    else()
      string(REPLACE ";" " " shown "${command}")
      set(reason "`${shown} --version` failed (${rc})")
      if(err)
        string(APPEND reason ": ${err}")
      endif()
    endif()
  endforeach()
  if(NOT found)
    set(UREWRITE_COMMAND "" PARENT_SCOPE)
    set(UREWRITE_VERSION "" PARENT_SCOPE)
    set(UREWRITE_NOT_FOUND_REASON "urewrite: ${reason}" PARENT_SCOPE)
    return()
  endif()
  string(REPLACE "|" ";" command "${found}")
  if(_UREWRITE_MODULE_VERSION AND NOT found_version STREQUAL _UREWRITE_MODULE_VERSION)
    string(REPLACE ";" " " shown "${command}")
    message(WARNING "urewrite: this CMake module (${_UREWRITE_MODULE_DIR}) comes with urewrite "
                    "${_UREWRITE_MODULE_VERSION}, but `${shown}` is urewrite ${found_version}: "
                    "set UREWRITE_EXECUTABLE, or urewrite_DIR, so that they agree")
  endif()
  set(UREWRITE_COMMAND "${command}" PARENT_SCOPE)
  set(UREWRITE_VERSION "${found_version}" PARENT_SCOPE)
  set(UREWRITE_NOT_FOUND_REASON "" PARENT_SCOPE)
endfunction()

_urewrite_find()

function(urewrite_instrument target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "KEEP_GOING;EXCLUDE_FROM_ALL"
                        "OUTPUT;TARGET;PROGRAM;CALL" "PROBES;RETURN;USDT;OPTIONS")
  if(arg_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "urewrite_instrument(${target}): unknown arguments: ${arg_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT UREWRITE_COMMAND)
    message(FATAL_ERROR "urewrite_instrument(${target}): ${UREWRITE_NOT_FOUND_REASON}")
  endif()
  if(NOT TARGET "${target}")
    message(FATAL_ERROR "urewrite_instrument(${target}): no target named ${target}")
  endif()
  get_target_property(aliased "${target}" ALIASED_TARGET)
  if(aliased)
    set(target "${aliased}")
  endif()
  get_target_property(type "${target}" TYPE)
  if(type STREQUAL "EXECUTABLE")
    set(dir_property RUNTIME_OUTPUT_DIRECTORY)
  elseif(type STREQUAL "SHARED_LIBRARY" OR type STREQUAL "MODULE_LIBRARY")
    set(dir_property LIBRARY_OUTPUT_DIRECTORY)
  else()
    message(FATAL_ERROR "urewrite_instrument(${target}): ${target} is a ${type}; "
                        "only executables and shared libraries can be rewritten")
  endif()
  if(NOT arg_PROBES AND NOT arg_RETURN AND NOT arg_USDT AND NOT arg_PROGRAM)
    message(FATAL_ERROR "urewrite_instrument(${target}): give at least one of PROBES, RETURN, "
                        "USDT, PROGRAM")
  endif()

  set(name "${arg_TARGET}")
  if(NOT name)
    set(name "${target}_probed")
  endif()

  # The output: relative paths start in the folder the target's own file goes to.
  get_target_property(imported "${target}" IMPORTED)
  set(dir "")
  if(NOT imported)
    get_target_property(dir "${target}" ${dir_property})
  endif()
  if(NOT dir OR dir MATCHES "\\$<")
    get_target_property(dir "${target}" BINARY_DIR)
    if(NOT dir)
      set(dir "${CMAKE_CURRENT_BINARY_DIR}")
    endif()
  endif()
  get_property(multi_config GLOBAL PROPERTY GENERATOR_IS_MULTI_CONFIG)
  if(multi_config AND NOT CMAKE_VERSION VERSION_LESS 3.20)
    string(APPEND dir "/$<CONFIG>")
  endif()
  set(output "${arg_OUTPUT}")
  if(NOT output)
    set(output "${target}.probed")
  endif()
  if(NOT IS_ABSOLUTE "${output}")
    set(output "${dir}/${output}")
  endif()
  get_filename_component(output_dir "${output}" DIRECTORY)
  if(NOT output_dir MATCHES "\\$<")
    file(MAKE_DIRECTORY "${output_dir}")
  endif()

  set(args)
  foreach(spec IN LISTS arg_PROBES)
    list(APPEND args -p "${spec}")
  endforeach()
  foreach(function IN LISTS arg_RETURN)
    list(APPEND args -r "${function}")
  endforeach()
  foreach(probe IN LISTS arg_USDT)
    if(NOT probe MATCHES "^usdt:")
      set(probe "usdt:${probe}")
    endif()
    list(APPEND args -p "${probe}")
  endforeach()
  if(arg_KEEP_GOING)
    list(APPEND args --keep-going)
  endif()
  set(sources)  # files the rewrite reads besides the target's: it re-runs when they change
  if(arg_PROGRAM)
    get_filename_component(program "${arg_PROGRAM}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_SOURCE_DIR}")
    list(APPEND args -f "${program}")
    list(APPEND sources "${program}")
  endif()
  if(arg_CALL)
    if(NOT arg_CALL MATCHES "^(.+):([A-Za-z_][A-Za-z0-9_]*)$")
      message(FATAL_ERROR "urewrite_instrument(${target}): CALL takes file.c:function, not ${arg_CALL}")
    endif()
    set(function "${CMAKE_MATCH_2}")
    get_filename_component(call_file "${CMAKE_MATCH_1}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_SOURCE_DIR}")
    list(APPEND args --call "${call_file}:${function}")
    list(APPEND sources "${call_file}")
  endif()
  list(APPEND args ${arg_OPTIONS})

  # The command line, less the input's path, in a file the command depends on, rewritten only
  # when its content changes: so a new probe list re-runs the rewrite with any generator (Ninja
  # also notices a changed command line by itself; Makefiles do not).
  set(args_file "${CMAKE_CURRENT_BINARY_DIR}/CMakeFiles/urewrite/${name}.args")
  set(content "# urewrite_instrument(${target}): the rewrite re-runs when this file changes.\n")
  string(APPEND content "version ${UREWRITE_VERSION}\n")
  foreach(word IN LISTS UREWRITE_COMMAND)
    string(APPEND content "command ${word}\n")
  endforeach()
  foreach(word IN LISTS args)
    string(APPEND content "arg ${word}\n")
  endforeach()
  string(APPEND content "output ${output}\n")
  set(old "")
  if(EXISTS "${args_file}")
    file(READ "${args_file}" old)
  endif()
  if(NOT old STREQUAL content)
    file(WRITE "${args_file}" "${content}")
  endif()

  set(depends "${target}" "${args_file}" ${sources})
  if(imported)
    list(APPEND depends "$<TARGET_FILE:${target}>")
  endif()
  set(make_dir)
  if(output_dir MATCHES "\\$<")
    set(make_dir COMMAND "${CMAKE_COMMAND}" -E make_directory "${output_dir}")
  endif()
  # A failed rewrite must not leave the previous output behind, looking current.
  if(CMAKE_VERSION VERSION_LESS 3.17)
    set(remove remove -f)
  else()
    set(remove rm -f)
  endif()
  add_custom_command(
    OUTPUT "${output}"
    ${make_dir}
    COMMAND "${CMAKE_COMMAND}" -E ${remove} "${output}"
    COMMAND ${UREWRITE_COMMAND} "$<TARGET_FILE:${target}>" ${args} -o "${output}"
    DEPENDS ${depends}
    COMMENT "urewrite: instrumenting ${target}"
    VERBATIM)
  set(all ALL)
  if(arg_EXCLUDE_FROM_ALL)
    set(all)
  endif()
  add_custom_target("${name}" ${all} DEPENDS "${output}")
  set_target_properties("${name}" PROPERTIES UREWRITE_OUTPUT "${output}"
                                             UREWRITE_SOURCE_TARGET "${target}")
endfunction()
