# Install rules (`cmake --install build --prefix P`), laid out as an HPC centre installs software:
#   P/bin/trainscope                      the binary; RPATH $ORIGIN/../lib + its dependencies' dirs
#   P/bin/trainscope-post, -study         wrappers that run the Python package below
#   P/share/trainscope/{postprocess,jobscripts,inputs,docs}   the clone's layout (postprocess/
#                                         holds trainscope_post and trainscope_jobs), so that
#                                         trainscope_jobs.paths finds the tree there
#   P/share/modulefiles/trainscope/<version>   a Tcl modulefile (environment-modules, Lmod)
# The prefix is relocatable: the modulefile and the wrappers derive it from their own place, the
# binary finds its own parts relative to itself, and its external libraries (LibTorch, MPI, HDF5,
# the CUDA wheels) stay where the site installed them, by absolute RPATH, as Spack and EasyBuild
# installations do. docs/install.md describes it; tests/jobscripts/test_install.py moves one.
include(GNUInstallDirs)

set(TRAINSCOPE_INSTALL_DATADIR "${CMAKE_INSTALL_DATADIR}/trainscope")
# The Python that the wrappers run (numpy, h5py, pandas, matplotlib): the one this build was
# configured with (scripts/build: the project's venv), else python3 on PATH. At run time
# TRAINSCOPE_PYTHON overrides it.
if(TRAINSCOPE_PYTHON)
  set(TRAINSCOPE_INSTALL_PYTHON "${TRAINSCOPE_PYTHON}")
else()
  find_program(TRAINSCOPE_INSTALL_PYTHON NAMES python3 python)
  if(NOT TRAINSCOPE_INSTALL_PYTHON)
    set(TRAINSCOPE_INSTALL_PYTHON python3)
  endif()
endif()

# The wrappers and the modulefile find the prefix relative to themselves.
file(RELATIVE_PATH TRAINSCOPE_BIN_TO_PREFIX "/p/${CMAKE_INSTALL_BINDIR}" "/p")
file(RELATIVE_PATH TRAINSCOPE_MODULEFILE_TO_PREFIX
     "/p/${CMAKE_INSTALL_DATADIR}/modulefiles/trainscope" "/p")

# --- the binary ----------------------------------------------------------------------------------
# $ORIGIN/../lib for anything trainscope itself installs beside it; the link directories of its
# external shared libraries outside the system's (LibTorch, Open MPI's lib dir, the nvidia wheels
# through trainscope_torch's -rpath) stay absolute.
set_target_properties(trainscope PROPERTIES
  INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}"
  INSTALL_RPATH_USE_LINK_PATH TRUE)
install(TARGETS trainscope RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

# --- the Python package and its wrappers ---------------------------------------------------------
install(DIRECTORY ${PROJECT_SOURCE_DIR}/postprocess/
  DESTINATION ${TRAINSCOPE_INSTALL_DATADIR}/postprocess
  FILES_MATCHING PATTERN "*.py" PATTERN "*.toml"
  PATTERN "__pycache__" EXCLUDE PATTERN "*.egg-info" EXCLUDE PATTERN "build" EXCLUDE)
foreach(_ts_cmd IN ITEMS trainscope-post trainscope-study)
  if(_ts_cmd STREQUAL "trainscope-post")
    set(TRAINSCOPE_WRAPPER_MODULE trainscope_post)
  else()
    set(TRAINSCOPE_WRAPPER_MODULE trainscope_jobs.study_cmd)
  endif()
  set(TRAINSCOPE_WRAPPER_NAME ${_ts_cmd})
  configure_file(${PROJECT_SOURCE_DIR}/cmake/install/wrapper.sh.in
                 ${PROJECT_BINARY_DIR}/install/${_ts_cmd} @ONLY)
  install(PROGRAMS ${PROJECT_BINARY_DIR}/install/${_ts_cmd} DESTINATION ${CMAKE_INSTALL_BINDIR})
endforeach()

# --- job-script templates, configurations, documentation ----------------------------------------
install(DIRECTORY ${PROJECT_SOURCE_DIR}/jobscripts ${PROJECT_SOURCE_DIR}/inputs
                  ${PROJECT_SOURCE_DIR}/docs
  DESTINATION ${TRAINSCOPE_INSTALL_DATADIR} USE_SOURCE_PERMISSIONS
  PATTERN "__pycache__" EXCLUDE)
install(FILES ${PROJECT_SOURCE_DIR}/README.md DESTINATION ${TRAINSCOPE_INSTALL_DATADIR})

# --- the modulefile ------------------------------------------------------------------------------
configure_file(${PROJECT_SOURCE_DIR}/cmake/install/modulefile.tcl.in
               ${PROJECT_BINARY_DIR}/install/modulefile @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/install/modulefile
  DESTINATION ${CMAKE_INSTALL_DATADIR}/modulefiles/trainscope RENAME ${PROJECT_VERSION})
