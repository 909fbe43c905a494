# Decides whether the CUDA kernels are built (FP8MLA_CUDA = AUTO | ON | OFF) and how.
# Sets FP8MLA_WITH_CUDA and FP8MLA_CUDA_ARCH_NAME, and defines fp8mla_cuda_options(target).
include(CheckLanguage)

set(FP8MLA_WITH_CUDA OFF)
if(FP8MLA_CUDA STREQUAL "AUTO" OR FP8MLA_CUDA STREQUAL "ON")
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(FP8MLA_WITH_CUDA ON)
  elseif(FP8MLA_CUDA STREQUAL "ON")
    message(FATAL_ERROR "FP8MLA_CUDA=ON but no CUDA compiler was found (is nvcc on the PATH?)")
  endif()
elseif(NOT FP8MLA_CUDA STREQUAL "OFF")
  message(FATAL_ERROR "FP8MLA_CUDA must be AUTO, ON or OFF, got '${FP8MLA_CUDA}'")
endif()

set(FP8MLA_CUDA_ARCH_NAME "")
if(FP8MLA_WITH_CUDA)
  # The kernels use Hopper-only instructions (wgmma, TMA, setmaxnreg), so device code is built for
  # sm_90a alone; the gencode flag is given directly because the "a" suffix needs CMake >= 3.29.
  set(CMAKE_CUDA_ARCHITECTURES OFF)
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)  # CMake < 3.26 lacks C++20 for nvcc
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    list(APPEND CMAKE_CUDA_COMPILE_FEATURES cuda_std_20)
  endif()
  set(CMAKE_CUDA_STANDARD 20)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  set(FP8MLA_CUDA_ARCH_NAME "sm_90a")
  message(STATUS "fp8mla: CUDA ${CUDAToolkit_VERSION}, device code for ${FP8MLA_CUDA_ARCH_NAME}")
else()
  message(STATUS "fp8mla: building without CUDA (FP8MLA_CUDA=${FP8MLA_CUDA})")
endif()

function(fp8mla_cuda_options target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:-gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -lineinfo>)
  if(FP8MLA_WGMMA_GUARD)
    # Before any launcher already set (ccache): cmake/wgmma_guard.sh runs the rest of the line.
    set_property(TARGET ${target} PROPERTY CUDA_COMPILER_LAUNCHER
      "${PROJECT_SOURCE_DIR}/cmake/wgmma_guard.sh" ${CMAKE_CUDA_COMPILER_LAUNCHER})
  endif()
endfunction()
