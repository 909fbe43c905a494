# CUTLASS/CuTe headers for the wgmma/TMA kernels: the include folder of the pinned version that
# scripts/setup.sh unpacks from PyPI's nvidia-cutlass wheel (or any folder given by the cache
# variable). Defines the interface target fp8mla_cutlass.
set(FP8MLA_CUTLASS_VERSION 4.2.0.0)
set(FP8MLA_CUTLASS_INCLUDE_DIR "${PROJECT_SOURCE_DIR}/.deps/cutlass-${FP8MLA_CUTLASS_VERSION}/include"
    CACHE PATH "CUTLASS ${FP8MLA_CUTLASS_VERSION} include folder (holds cute/ and cutlass/)")
if(NOT EXISTS "${FP8MLA_CUTLASS_INCLUDE_DIR}/cute/arch/mma_sm90_gmma.hpp")
  message(FATAL_ERROR "CUTLASS headers not found in '${FP8MLA_CUTLASS_INCLUDE_DIR}': run "
                      "scripts/setup.sh, or set FP8MLA_CUTLASS_INCLUDE_DIR")
endif()
add_library(fp8mla_cutlass INTERFACE)
target_include_directories(fp8mla_cutlass SYSTEM INTERFACE "${FP8MLA_CUTLASS_INCLUDE_DIR}")

# One instantiation file per line of prefill_variants.def, into `out_var`.
function(fp8mla_prefill_instances out_var)
  set(def "${PROJECT_SOURCE_DIR}/src/cuda/attention/prefill_variants.def")
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${def}")
  file(STRINGS "${def}" lines REGEX "^FP8MLA_PREFILL_VARIANT\\(")
  set(files "")
  foreach(line IN LISTS lines)
    string(REGEX MATCH "\\(([^)]*)\\)" _ "${line}")
    string(REPLACE "," ";" fields "${CMAKE_MATCH_1}")
    list(TRANSFORM fields STRIP)
    list(GET fields 0 VARIANT_NAME)
    list(GET fields 1 VARIANT_FP8)
    list(GET fields 2 VARIANT_CAUSAL)
    list(GET fields 3 VARIANT_DQK)
    list(GET fields 4 VARIANT_DV)
    list(GET fields 5 VARIANT_FOLD)
    set(file "${PROJECT_BINARY_DIR}/generated/attention/prefill_${VARIANT_NAME}.cu")
    configure_file("${PROJECT_SOURCE_DIR}/src/cuda/attention/prefill_instance.cu.in" "${file}" @ONLY)
    list(APPEND files "${file}")
  endforeach()
  set(${out_var} "${files}" PARENT_SCOPE)
endfunction()
