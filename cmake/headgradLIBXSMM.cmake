# Finds libxsmm 1.x (its JIT small-GEMM kernels, libxsmm_?mmdispatch) and makes the imported
# target headgrad::libxsmm. Sets HEADGRAD_LIBXSMM_FOUND, HEADGRAD_LIBXSMM_VERSION and
# HEADGRAD_LIBXSMM_LIBRARIES (the files to link, in order).
#
# Looks at pkg-config's `libxsmm`, then the usual file names. Debian (libxsmm-dev) ships static
# libraries only; libxsmm.a calls a BLAS (sgemm_, dgemm_) for shapes it has no kernel for, which
# headgrad never asks of it. Set HEADGRAD_LIBXSMM_WITH_BLAS to FALSE before including this file
# when no BLAS is linked: libxsmmnoblas.a then stands in for those two symbols.
# libxsmm 2.x changed the dispatch interface and is not used.
if(TARGET headgrad::libxsmm)
  set(HEADGRAD_LIBXSMM_FOUND TRUE)
  return()
endif()
set(HEADGRAD_LIBXSMM_FOUND FALSE)
unset(_hg_xsmm_hints)
find_package(PkgConfig QUIET)
if(PKG_CONFIG_FOUND)
  pkg_check_modules(_HG_XSMM QUIET libxsmm)
  if(_HG_XSMM_FOUND)
    set(_hg_xsmm_hints ${_HG_XSMM_LIBRARY_DIRS})
    set(_hg_xsmm_inc_hints ${_HG_XSMM_INCLUDE_DIRS})
  endif()
endif()
find_path(HEADGRAD_LIBXSMM_INCLUDE_DIR libxsmm.h HINTS ${_hg_xsmm_inc_hints})
find_library(HEADGRAD_LIBXSMM_LIBRARY NAMES xsmm HINTS ${_hg_xsmm_hints})
find_library(HEADGRAD_LIBXSMM_NOBLAS_LIBRARY NAMES xsmmnoblas HINTS ${_hg_xsmm_hints})
mark_as_advanced(HEADGRAD_LIBXSMM_INCLUDE_DIR HEADGRAD_LIBXSMM_LIBRARY HEADGRAD_LIBXSMM_NOBLAS_LIBRARY)
if(HEADGRAD_LIBXSMM_INCLUDE_DIR AND HEADGRAD_LIBXSMM_LIBRARY)
  set(_hg_xsmm_major "")
  foreach(_hg_header libxsmm_version.h libxsmm_config.h)
    if(NOT _hg_xsmm_major AND EXISTS "${HEADGRAD_LIBXSMM_INCLUDE_DIR}/${_hg_header}")
      file(STRINGS "${HEADGRAD_LIBXSMM_INCLUDE_DIR}/${_hg_header}" _hg_lines
           REGEX "#define LIBXSMM_CONFIG_VERSION_(MAJOR|MINOR) [0-9]+")
      foreach(_hg_line ${_hg_lines})
        if(_hg_line MATCHES "MAJOR ([0-9]+)")
          set(_hg_xsmm_major ${CMAKE_MATCH_1})
        elseif(_hg_line MATCHES "MINOR ([0-9]+)")
          set(_hg_xsmm_minor ${CMAKE_MATCH_1})
        endif()
      endforeach()
    endif()
  endforeach()
  if(_hg_xsmm_major STREQUAL "1")
    set(HEADGRAD_LIBXSMM_VERSION "${_hg_xsmm_major}.${_hg_xsmm_minor}")
    set(HEADGRAD_LIBXSMM_LIBRARIES ${HEADGRAD_LIBXSMM_LIBRARY})
    if(DEFINED HEADGRAD_LIBXSMM_WITH_BLAS AND NOT HEADGRAD_LIBXSMM_WITH_BLAS AND HEADGRAD_LIBXSMM_NOBLAS_LIBRARY)
      list(APPEND HEADGRAD_LIBXSMM_LIBRARIES ${HEADGRAD_LIBXSMM_NOBLAS_LIBRARY})
    endif()
    list(APPEND HEADGRAD_LIBXSMM_LIBRARIES pthread ${CMAKE_DL_LIBS} m rt)
    add_library(headgrad::libxsmm INTERFACE IMPORTED)
    set_target_properties(headgrad::libxsmm PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${HEADGRAD_LIBXSMM_INCLUDE_DIR}"
      INTERFACE_LINK_LIBRARIES "${HEADGRAD_LIBXSMM_LIBRARIES}")
    set(HEADGRAD_LIBXSMM_FOUND TRUE)
  elseif(_hg_xsmm_major)
    set(HEADGRAD_LIBXSMM_VERSION "${_hg_xsmm_major}.${_hg_xsmm_minor}")
  endif()
endif()
