# find_package(urewrite) lands here. Point CMake at this folder with
#     cmake -Durewrite_DIR="$(urewrite --cmake-dir)" ...
# or add it to CMAKE_PREFIX_PATH. It defines urewrite_instrument(); see urewrite.cmake.

include("${CMAKE_CURRENT_LIST_DIR}/urewrite.cmake")

if(NOT UREWRITE_COMMAND)
  set(urewrite_FOUND FALSE)
  set(urewrite_NOT_FOUND_MESSAGE "${UREWRITE_NOT_FOUND_REASON}")
endif()
