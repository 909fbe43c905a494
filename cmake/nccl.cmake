# NCCL communicators (fp8mla/mla_parallel.hpp): nccl.h at build time; the library is loaded at run
# time, so nothing more is linked. The header is looked for under NCCL_ROOT (CMake or
# environment), in the nvidia-nccl-cu13 wheel of the python3 on PATH, and in the system paths.
# Sets FP8MLA_WITH_NCCL.
set(FP8MLA_NCCL AUTO CACHE STRING "NCCL communicators: AUTO (when nccl.h is found), ON or OFF")
set_property(CACHE FP8MLA_NCCL PROPERTY STRINGS AUTO ON OFF)
set(FP8MLA_WITH_NCCL OFF)
if(NOT FP8MLA_NCCL STREQUAL "OFF")
  set(_fp8mla_nccl_hints ${NCCL_ROOT} $ENV{NCCL_ROOT})
  find_program(FP8MLA_PYTHON3 python3)
  if(FP8MLA_PYTHON3)
    execute_process(
      COMMAND ${FP8MLA_PYTHON3} -c "import nvidia.nccl as m; print(list(m.__path__)[0])"
      OUTPUT_VARIABLE _fp8mla_nccl_wheel OUTPUT_STRIP_TRAILING_WHITESPACE
      RESULT_VARIABLE _fp8mla_nccl_rc ERROR_QUIET)
    if(_fp8mla_nccl_rc EQUAL 0)
      list(APPEND _fp8mla_nccl_hints ${_fp8mla_nccl_wheel})
    endif()
  endif()
  find_path(FP8MLA_NCCL_INCLUDE_DIR nccl.h HINTS ${_fp8mla_nccl_hints} PATH_SUFFIXES include)
  find_library(FP8MLA_NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${_fp8mla_nccl_hints}
    PATH_SUFFIXES lib lib64)
  if(FP8MLA_NCCL_INCLUDE_DIR)
    set(FP8MLA_WITH_NCCL ON)
  elseif(FP8MLA_NCCL STREQUAL "ON")
    message(FATAL_ERROR "FP8MLA_NCCL=ON but nccl.h was not found: set NCCL_ROOT, or install the "
      "nvidia-nccl-cu13 wheel for the python3 on PATH")
  endif()
endif()
if(FP8MLA_WITH_NCCL)
  target_sources(fp8mla PRIVATE src/cuda/model/nccl_communicator.cpp)
  target_include_directories(fp8mla PRIVATE ${FP8MLA_NCCL_INCLUDE_DIR})
  target_link_libraries(fp8mla PRIVATE ${CMAKE_DL_LIBS})
  target_compile_definitions(fp8mla PUBLIC FP8MLA_WITH_NCCL)
  if(FP8MLA_NCCL_LIBRARY)
    # Where the build found the library: tried when libnccl.so.2 is not on the loader path.
    target_compile_definitions(fp8mla PRIVATE FP8MLA_NCCL_LIBRARY="${FP8MLA_NCCL_LIBRARY}")
  endif()
  message(STATUS "fp8mla: NCCL communicators, nccl.h from ${FP8MLA_NCCL_INCLUDE_DIR}")
else()
  target_sources(fp8mla PRIVATE src/model/no_nccl.cpp)
  message(STATUS "fp8mla: no NCCL header found; the NCCL communicators report kUnsupported")
endif()
