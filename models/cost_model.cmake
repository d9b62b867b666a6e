# The cost model (FLOPs, bytes, roofline durations of compute steps) and the measured layer
# tables that correct it (gpu.layer_table). Its own small target so the CLI and the simulator
# can use it without the Eigen forward pass of kvtier_models.
add_library(kvtier_cost STATIC
  ${CMAKE_CURRENT_LIST_DIR}/cost_model.cc
  ${CMAKE_CURRENT_LIST_DIR}/layer_table.cc
)
target_include_directories(kvtier_cost PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(kvtier_cost PUBLIC kvtier_core)
# Simulated durations: bit-identical in every build type (see core/CMakeLists.txt).
target_compile_options(kvtier_cost PRIVATE -ffp-contract=off)
