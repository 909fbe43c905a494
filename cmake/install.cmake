# Installs fp8mla as a CMake package: find_package(fp8mla) then link fp8mla::fp8mla (the ops, the
# attention backends and the MLA layer) and fp8mla::model (safetensors weights), where it was built.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(fp8mla_installed_targets fp8mla)
if(TARGET fp8mla_model)
  list(APPEND fp8mla_installed_targets fp8mla_model)
endif()
install(TARGETS ${fp8mla_installed_targets} EXPORT fp8mlaTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY include/fp8mla DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.hpp")
install(FILES ${PROJECT_BINARY_DIR}/include/fp8mla/version.hpp
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/fp8mla)

set(FP8MLA_CONFIG_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/fp8mla)
install(EXPORT fp8mlaTargets NAMESPACE fp8mla:: DESTINATION ${FP8MLA_CONFIG_DIR})
configure_package_config_file(cmake/fp8mlaConfig.cmake.in
  ${PROJECT_BINARY_DIR}/fp8mlaConfig.cmake INSTALL_DESTINATION ${FP8MLA_CONFIG_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/fp8mlaConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/fp8mlaConfig.cmake ${PROJECT_BINARY_DIR}/fp8mlaConfigVersion.cmake
  DESTINATION ${FP8MLA_CONFIG_DIR})
