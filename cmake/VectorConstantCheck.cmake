# A compiler check for a wrong-code bug that GCC 12.2 (Debian bookworm's g++) has with AVX-512:
# with -march=native on an AVX-512 CPU (or -mavx512f), at -O2 and -O3, the basic-block (SLP)
# vectorizer stores a constant whose leading elements repeat and whose tail is zero -- e.g.
# `std::vector<double> v; v = {3, 3, 0, 0};` -- as a broadcast of the leading element:
# v holds {3, 3, 3, 3}. Measured on this project's build machine (AMD Zen 4 VM), for double,
# int64 and float elements ({3, 3, 3, 3, 0, 0, 0, 0} becomes eight 3s); `-mavx2` alone, -O1,
# clang 14, `-fno-tree-slp-vectorize` and `-fno-tree-vectorize` give the right values. It was
# found by a Release build of the test suite, where
# ImportanceModelV2.RecencyRaisesTheLastTokens set `p.recency = {3, 3, 0, 0}` and measured
# a model with recency {3, 3, 3, 3}.
#
# The check compiles and runs a program with those stores at the project's -march and -O2 and
# -O3; if it reads back wrong values, every C++ file is compiled with -fno-tree-slp-vectorize
# (loop vectorization stays on: the hot loops are loops) and the check runs again with it, which
# must then pass. Cross-compiling (nothing to run) skips it.
include(CheckCXXSourceRuns)

set(_kvtier_vc_source [=[
#include <cstdint>
#include <cstdio>
#include <vector>
struct P { std::vector<double> a = {0.8}; std::vector<double> r; int x = 4; };
__attribute__((noinline)) int Bad(const P& p) {
  const double want[4] = {3, 3, 0, 0};
  if (p.r.size() != 4) return 1;
  for (int i = 0; i < 4; ++i) if (p.r[i] != want[i]) return 1;
  return 0;
}
__attribute__((noinline)) int BadI(const std::vector<std::int64_t>& v) {
  return v.size() != 4 || v[0] != 5 || v[1] != 5 || v[2] != 0 || v[3] != 0;
}
__attribute__((noinline)) int BadF(const std::vector<float>& v) {
  if (v.size() != 8) return 1;
  for (int i = 0; i < 8; ++i) if (v[i] != (i < 4 ? 3.0f : 0.0f)) return 1;
  return 0;
}
int main() {
  P p; p.x = 0; p.r = {3, 3, 0, 0};
  std::vector<std::int64_t> q = {5, 5, 0, 0};
  std::vector<float> f = {3, 3, 3, 3, 0, 0, 0, 0};
  const int bad = Bad(p) + BadI(q) + BadF(f);
  if (bad) std::puts("constant vectors stored wrongly");
  return bad;
}
]=])

# kvtier_vector_constants_ok(<flags> <result var>): whether the program above runs correctly
# compiled with <flags> at -O2 and at -O3 (one cached result per flag set).
function(kvtier_vector_constants_ok flags out)
  string(MAKE_C_IDENTIFIER "KVTIER_VECTOR_CONSTANTS_${flags}" var)
  set(ok TRUE)
  foreach(level 2 3)
    set(CMAKE_REQUIRED_FLAGS "${flags} -O${level}")
    set(CMAKE_REQUIRED_QUIET ON)
    check_cxx_source_runs("${_kvtier_vc_source}" ${var}_O${level})
    if(NOT ${var}_O${level})
      set(ok FALSE)
    endif()
  endforeach()
  set(${out} ${ok} PARENT_SCOPE)
endfunction()

# Adds -fno-tree-slp-vectorize to every C++ compile when the compiler stores constant vectors
# wrongly with `arch_flags` (e.g. "-march=native"); fails the configuration if that is not
# enough. Sets KVTIER_NO_SLP_VECTORIZE (ON when the flag was added) for the summary line.
function(kvtier_check_vector_constants arch_flags)
  set(KVTIER_NO_SLP_VECTORIZE OFF PARENT_SCOPE)
  if(CMAKE_CROSSCOMPILING OR NOT CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    return()
  endif()
  kvtier_vector_constants_ok("${arch_flags}" ok)
  if(ok)
    message(STATUS "kvtier: constant vectors at -O2/-O3 ${arch_flags}: stored correctly")
    return()
  endif()
  kvtier_vector_constants_ok("${arch_flags} -fno-tree-slp-vectorize" ok)
  if(NOT ok)
    message(FATAL_ERROR
      "kvtier: ${CMAKE_CXX_COMPILER} (GCC ${CMAKE_CXX_COMPILER_VERSION}) stores constant vectors "
      "such as {3, 3, 0, 0} wrongly with '${arch_flags}', even with -fno-tree-slp-vectorize "
      "(cmake/VectorConstantCheck.cmake). Configure with -DKVTIER_NATIVE=OFF or another compiler.")
  endif()
  message(STATUS "kvtier: GCC ${CMAKE_CXX_COMPILER_VERSION} stores constant vectors such as "
                 "{3, 3, 0, 0} wrongly with ${arch_flags} (AVX-512 SLP bug): compiling with "
                 "-fno-tree-slp-vectorize (cmake/VectorConstantCheck.cmake)")
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:-fno-tree-slp-vectorize>")
  set(KVTIER_NO_SLP_VECTORIZE ON PARENT_SCOPE)
endfunction()
