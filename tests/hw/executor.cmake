# HwExecutor, `kvtier calibrate` and `kvtier hw` tests (host backend on the real disk; GPU tests
# skip without a device). Included from tests/hw/CMakeLists.txt.
kvtier_add_test(NAME hw_executor_test SOURCES hw_executor_test.cc
                LIBS kvtier_hw kvtier_testutil LABELS unit)
kvtier_add_test(NAME hw_executor_gpu_test SOURCES hw_executor_gpu_test.cc
                LIBS kvtier_hw kvtier_testutil LABELS gpu)
kvtier_add_test(NAME hw_cli_test SOURCES hw_cli_test.cc LIBS kvtier_core kvtier_cost LABELS unit)
kvtier_add_test(NAME hw_run_test SOURCES hw_run_test.cc LIBS kvtier_core kvtier_results LABELS slow)
# `kvtier hw` and `kvtier validate` with decode systems (issue 17), batch size 1.
kvtier_add_test(NAME hw_decode_cli_test SOURCES hw_decode_cli_test.cc LIBS kvtier_core
                kvtier_results LABELS slow)
foreach(t hw_cli_test hw_run_test hw_decode_cli_test)
  add_dependencies(${t} kvtier)
  target_compile_definitions(${t} PRIVATE KVTIER_CLI="$<TARGET_FILE:kvtier>")
endforeach()
kvtier_add_test(NAME hw_device_backend_test SOURCES device_backend_test.cc
                LIBS kvtier_hw kvtier_testutil LABELS unit)
# Fault injection (issue 18): read, write and device faults at their seams and as failed runs.
kvtier_add_test(NAME hw_fault_injection_test SOURCES fault_injection_test.cc
                LIBS kvtier_hw kvtier_testutil LABELS unit)
kvtier_add_test(NAME hw_cake_test SOURCES hw_cake_test.cc
                LIBS kvtier_hw kvtier_testutil LABELS unit)
# Transfer strategies (DESIGN-14): the pieces, batched calls, device gathers, CPU gathers and
# extent reads HwExecutor asks the backend for, counted at the DeviceBackend interface.
kvtier_add_test(NAME hw_transfer_strategies_test SOURCES transfer_strategies_test.cc
                LIBS kvtier_hw LABELS unit)
if(KVTIER_HAVE_CUDA)
  # The CUDA strategies: the device-gather kernel vs its CPU reference, and per-run, batched and
  # device-gather copies of the cuda backend moving the same bytes. Skips without a device.
  kvtier_add_test(NAME hw_cuda_strategies_test SOURCES cuda_strategies_test.cc
                  LIBS kvtier_hw LABELS gpu)
endif()
# Parity of the transfer strategies: per op, what the simulator charges is what the host
# backend was asked to do, for every strategy, SSD read unit and system (issue 14).
kvtier_add_test(NAME hw_strategy_parity_test SOURCES strategy_parity_test.cc
                LIBS kvtier_hw kvtier_sim kvtier_testutil LABELS parity)
kvtier_add_test(NAME hw_calibrate_fit_test SOURCES calibrate_fit_test.cc LIBS kvtier_hwrun
                LABELS unit)
# Decode at batch size 1 (issue 17): hw issues the decode ops the simulator charges, for every
# decode policy and transfer strategy, and the decode home holds the decoded sequence's KV.
kvtier_add_test(NAME hw_decode_parity_test SOURCES decode_parity_test.cc
                LIBS kvtier_hw kvtier_sim kvtier_testutil LABELS parity)
