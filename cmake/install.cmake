# Installing deft: the headers, libdeft.a, a CMake package (find_package(deft) -> deft::deft) and a pkg-config file.
# Included from the top-level CMakeLists.txt after the `deft` target exists. Everything that libdeft.a's public link
# interface needs is recorded here, because a static library carries none of its dependencies itself.
include(CMakePackageConfigHelpers)

set(DEFT_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/deft" CACHE STRING
    "Where the deft CMake package (deftConfig.cmake) is installed, relative to the prefix")
mark_as_advanced(DEFT_INSTALL_CMAKEDIR)

install(TARGETS deft EXPORT deftTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
# deft.h and the headers it includes (include/deft/*.h); testing/deft_testing.h is for deft's own tests and stays out.
install(FILES ${PROJECT_SOURCE_DIR}/include/deft.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
file(GLOB DEFT_PUBLIC_HEADERS CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/include/deft/*.h)
install(FILES ${DEFT_PUBLIC_HEADERS} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/deft)
install(EXPORT deftTargets NAMESPACE deft:: FILE deftTargets.cmake DESTINATION ${DEFT_INSTALL_CMAKEDIR})

# ---- facts the package config needs (substituted into deftConfig.cmake.in) ----
if(OpenMP_C_FOUND)
  set(DEFT_PKG_OPENMP ON)
else()
  set(DEFT_PKG_OPENMP OFF)
endif()
set(DEFT_PKG_CUDA ${DEFT_HAVE_CUDA})
set(DEFT_PKG_BLAS ${DEFT_HAVE_BLAS})
set(DEFT_PKG_CBLAS_LIB "")
if(DEFT_HAVE_BLAS)
  set(DEFT_PKG_CBLAS_LIB "${DEFT_CBLAS_LIB}")
endif()
set(DEFT_PKG_CUDA_ROOT "")
if(DEFT_HAVE_CUDA)
  # A hint for find_dependency(CUDAToolkit) in consumers: the toolkit this library was built against.
  if(CUDAToolkit_BIN_DIR)
    get_filename_component(DEFT_PKG_CUDA_ROOT "${CUDAToolkit_BIN_DIR}" DIRECTORY)
  elseif(CUDAToolkit_LIBRARY_ROOT)
    set(DEFT_PKG_CUDA_ROOT "${CUDAToolkit_LIBRARY_ROOT}")
  endif()
endif()
set(DEFT_PKG_SANITIZE ${DEFT_SANITIZE})

configure_package_config_file(
  ${PROJECT_SOURCE_DIR}/cmake/deftConfig.cmake.in
  ${PROJECT_BINARY_DIR}/deftConfig.cmake
  INSTALL_DESTINATION ${DEFT_INSTALL_CMAKEDIR})
write_basic_package_version_file(
  ${PROJECT_BINARY_DIR}/deftConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMinorVersion)   # 0.x: a new minor version may break the API
install(FILES ${PROJECT_BINARY_DIR}/deftConfig.cmake ${PROJECT_BINARY_DIR}/deftConfigVersion.cmake
        DESTINATION ${DEFT_INSTALL_CMAKEDIR})

# ---- pkg-config ----
# libdeft.a is static, so everything it needs goes into Libs (a plain `pkg-config --libs deft` must link) and is
# repeated in Libs.private for tools that only look there.
set(DEFT_PC_LIBS "")
if(DEFT_SANITIZE)
  list(APPEND DEFT_PC_LIBS -fsanitize=address,undefined)
endif()
if(DEFT_HAVE_BLAS)
  # The very library deft was built with, by its full path as in CMake, and for a shared one an rpath to the folder
  # it really lies in. A plain -lopenblas would link, but at run time libopenblas.so.0 would be whichever variant
  # the system selects (on Debian/Ubuntu an alternative, the pthread build by default), whose threads fight
  # OpenMP's and make a CPU step many times slower; the rpath keeps the program on the variant deft chose.
  list(APPEND DEFT_PC_LIBS "${DEFT_CBLAS_LIB}")
  if(NOT DEFT_CBLAS_LIB MATCHES "\\.a$")
    get_filename_component(_deft_blas_real "${DEFT_CBLAS_LIB}" REALPATH)
    get_filename_component(_deft_blas_dir "${_deft_blas_real}" DIRECTORY)
    list(APPEND DEFT_PC_LIBS "-Wl,-rpath,${_deft_blas_dir}")
  endif()
endif()
if(DEFT_HAVE_CUDA)
  # cudart, cuBLAS and cuBLASLt, with an rpath so that the program finds them where they were at build time.
  list(APPEND DEFT_PC_LIBS "-L${CUDAToolkit_LIBRARY_DIR}" "-Wl,-rpath,${CUDAToolkit_LIBRARY_DIR}"
       -lcublasLt -lcublas -lcudart)
  if(DEFT_CUDNN_INCLUDE AND DEFT_CUDNN_LIB)
    # conv2d's cuDNN calls (ops/cuda/cuda_conv.cu), linked by absolute path in CMake
    get_filename_component(_deft_cudnn_dir "${DEFT_CUDNN_LIB}" DIRECTORY)
    list(APPEND DEFT_PC_LIBS "-L${_deft_cudnn_dir}" "-Wl,-rpath,${_deft_cudnn_dir}" -lcudnn)
  endif()
  if(DEFT_HAVE_NCCL)
    # data parallel training's NCCL calls (dist/dist_nccl.c), linked by absolute path in CMake
    get_filename_component(_deft_nccl_dir "${DEFT_NCCL_LIB}" DIRECTORY)
    list(APPEND DEFT_PC_LIBS "-L${_deft_nccl_dir}" "-Wl,-rpath,${_deft_nccl_dir}" -lnccl)
  endif()
  # nvcc objects may refer to the C++ runtime (and cudart to libdl/librt/pthread on older glibc).
  list(APPEND DEFT_PC_LIBS -lstdc++ -ldl -lrt -lpthread)
endif()
if(OpenMP_C_FOUND)
  separate_arguments(_deft_omp_flags UNIX_COMMAND "${OpenMP_C_FLAGS}")
  list(APPEND DEFT_PC_LIBS ${_deft_omp_flags})
endif()
list(APPEND DEFT_PC_LIBS -lm)
list(REMOVE_DUPLICATES DEFT_PC_LIBS)
string(REPLACE ";" " " DEFT_PC_LIBS "${DEFT_PC_LIBS}")

set(DEFT_PC_CFLAGS "")
if(DEFT_HAVE_CUDA)
  set(DEFT_PC_CFLAGS "-DDEFT_HAVE_CUDA=1")
endif()

# The prefix is written relative to the .pc file, so `cmake --install --prefix <anywhere>` gives a working file.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(DEFT_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
  set(DEFT_PC_LIBDIR "${CMAKE_INSTALL_LIBDIR}")
else()
  file(RELATIVE_PATH _deft_pc_up "/deft_prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/deft_prefix")
  string(REGEX REPLACE "/$" "" _deft_pc_up "${_deft_pc_up}")
  set(DEFT_PC_PREFIX "\${pcfiledir}/${_deft_pc_up}")
  set(DEFT_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
endif()
if(IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(DEFT_PC_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}")
else()
  set(DEFT_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()

configure_file(${PROJECT_SOURCE_DIR}/cmake/deft.pc.in ${PROJECT_BINARY_DIR}/deft.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/deft.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
