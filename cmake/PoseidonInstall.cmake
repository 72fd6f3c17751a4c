# Install rules for the C API (component "Poseidon"):
#   <prefix>/include/poseidon.h
#   <prefix>/lib/libposeidon.so (+ SONAME link)
#   <prefix>/lib/cmake/Poseidon/PoseidonConfig.cmake, ...ConfigVersion.cmake, ...Targets.cmake
#     find_package(Poseidon) gives the imported target Poseidon::poseidon, with MPI found
#     through find_dependency (its headers are part of the API: poseidon.h includes mpi.h)
#   <prefix>/lib/pkgconfig/poseidon.pc
# Install with: cmake --install <build> --prefix <prefix> --component Poseidon
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(POSEIDON_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/Poseidon)

install(TARGETS poseidon EXPORT PoseidonTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT Poseidon
  PUBLIC_HEADER DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT Poseidon
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT PoseidonTargets NAMESPACE Poseidon:: DESTINATION ${POSEIDON_CMAKE_DIR}
  COMPONENT Poseidon)

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/PoseidonConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/PoseidonConfig.cmake INSTALL_DESTINATION ${POSEIDON_CMAKE_DIR})
# 0.x releases may break the API between minor versions: only the same minor is compatible.
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/PoseidonConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/PoseidonConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/PoseidonConfigVersion.cmake
        DESTINATION ${POSEIDON_CMAKE_DIR} COMPONENT Poseidon)

# pkg-config: MPI comes through its own .pc file when the MPI installation has one (Open MPI:
# ompi-c, MPICH: mpich), else its flags are written in directly.
find_package(PkgConfig QUIET)
set(POSEIDON_PC_REQUIRES "")
set(POSEIDON_PC_MPI_CFLAGS "")
set(POSEIDON_PC_MPI_LIBS "")
if(PKG_CONFIG_FOUND)
  foreach(candidate ompi-c mpich mpi-c)
    pkg_check_modules(_psd_pc_mpi QUIET ${candidate})
    if(_psd_pc_mpi_FOUND)
      set(POSEIDON_PC_REQUIRES ${candidate})
      break()
    endif()
  endforeach()
endif()
if(NOT POSEIDON_PC_REQUIRES)
  foreach(dir IN LISTS MPI_C_INCLUDE_DIRS)
    string(APPEND POSEIDON_PC_MPI_CFLAGS " -I${dir}")
  endforeach()
  foreach(lib IN LISTS MPI_C_LIBRARIES)
    string(APPEND POSEIDON_PC_MPI_LIBS " ${lib}")
  endforeach()
endif()
# <prefix>/<libdir>/pkgconfig -> <prefix>: one ".." per component of libdir, plus pkgconfig.
file(RELATIVE_PATH POSEIDON_PC_UP /x/${CMAKE_INSTALL_LIBDIR}/pkgconfig /x)
configure_file(${PROJECT_SOURCE_DIR}/cmake/poseidon.pc.in ${CMAKE_CURRENT_BINARY_DIR}/poseidon.pc
               @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/poseidon.pc
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT Poseidon)
