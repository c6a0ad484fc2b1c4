# Tests of the launch wrappers (launch/tpinfer-local, launch/tpinfer-cluster) and of a
# real two-"node" run: two network namespaces joined by a veth pair, Open MPI over TCP.
# Plain bash tests; exit 77 = skipped (no mpirun, not root / namespaces denied, no model).
set(_launch_sh ${CMAKE_SOURCE_DIR}/tests/test_launch.sh)

# --dry-run argv against tests/launch/*.argv, and the error cases
add_test(NAME launch_dryrun COMMAND bash ${_launch_sh} dryrun ${CMAKE_SOURCE_DIR})
# SIGTERM / SIGINT to the wrapper reach every rank (the wrapper execs mpirun)
add_test(NAME launch_signal COMMAND bash ${_launch_sh} signal ${CMAKE_SOURCE_DIR})
# two namespaces as two hosts: mpirun hello, then `tpinfer comm --check-only`
add_test(NAME launch_netns COMMAND bash ${_launch_sh} netns ${CMAKE_SOURCE_DIR}
         $<TARGET_FILE:tpinfer>)
# the same hosts: `tpinfer run --pp 2` across them = a single-rank run's tokens
add_test(NAME launch_netns_run COMMAND bash ${_launch_sh} netns-run ${CMAKE_SOURCE_DIR}
         $<TARGET_FILE:tpinfer>)

set_tests_properties(launch_dryrun launch_signal launch_netns launch_netns_run PROPERTIES
                     LABELS unit SKIP_RETURN_CODE 77 TIMEOUT 120
                     ENVIRONMENT "OMP_WAIT_POLICY=passive;OMPI_MCA_rmaps_base_oversubscribe=1")
