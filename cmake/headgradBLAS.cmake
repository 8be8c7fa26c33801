# Finds OpenBLAS and makes the imported target headgrad::openblas (include dir + library).
# Sets HEADGRAD_OPENBLAS_FOUND and HEADGRAD_OPENBLAS_LIBRARY. Used by headgrad's own build and,
# installed, by headgradConfig.cmake, so that a program linking the static headgrad_autograd
# also links the BLAS it calls.
#
# Looks, in order, at OpenBLAS's own CMake package (OpenBLASConfig.cmake), pkg-config's
# `openblas`, then the usual file names. The OpenMP build is preferred (Debian:
# libopenblas-openmp-dev): inside headgrad's parallel regions it runs on one thread.
if(TARGET headgrad::openblas)
  set(HEADGRAD_OPENBLAS_FOUND TRUE)
  return()
endif()
set(HEADGRAD_OPENBLAS_FOUND FALSE)
unset(_hg_blas_inc)
unset(_hg_blas_lib)

find_package(OpenBLAS CONFIG QUIET)
if(OpenBLAS_FOUND AND OpenBLAS_LIBRARIES AND OpenBLAS_INCLUDE_DIRS)
  set(_hg_blas_inc ${OpenBLAS_INCLUDE_DIRS})
  set(_hg_blas_lib ${OpenBLAS_LIBRARIES})
endif()
if(NOT _hg_blas_lib)
  find_package(PkgConfig QUIET)
  if(PKG_CONFIG_FOUND)
    pkg_check_modules(_HG_OPENBLAS QUIET openblas)
    if(_HG_OPENBLAS_FOUND)
      find_library(_hg_blas_pc_lib NAMES openblas HINTS ${_HG_OPENBLAS_LIBRARY_DIRS} NO_DEFAULT_PATH)
      if(_hg_blas_pc_lib)
        set(_hg_blas_lib ${_hg_blas_pc_lib})
        set(_hg_blas_inc ${_HG_OPENBLAS_INCLUDE_DIRS})
      endif()
    endif()
  endif()
endif()
if(NOT _hg_blas_lib)
  find_library(_hg_blas_any_lib NAMES openblas PATH_SUFFIXES openblas-openmp openblas openblas-pthread)
  if(_hg_blas_any_lib)
    set(_hg_blas_lib ${_hg_blas_any_lib})
  endif()
endif()
# The header: cblas.h next to openblas_config.h (not another BLAS's cblas.h).
if(_hg_blas_lib)
  find_path(_hg_blas_header openblas_config.h HINTS ${_hg_blas_inc}
            PATH_SUFFIXES openblas-openmp openblas openblas-pthread)
  if(_hg_blas_header AND EXISTS "${_hg_blas_header}/cblas.h")
    set(_hg_blas_inc ${_hg_blas_header})
    add_library(headgrad::openblas INTERFACE IMPORTED)
    set_target_properties(headgrad::openblas PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${_hg_blas_inc}"
      INTERFACE_LINK_LIBRARIES "${_hg_blas_lib}")
    set(HEADGRAD_OPENBLAS_FOUND TRUE)
    set(HEADGRAD_OPENBLAS_LIBRARY "${_hg_blas_lib}")
    set(HEADGRAD_OPENBLAS_INCLUDE_DIR "${_hg_blas_inc}")
  endif()
endif()
