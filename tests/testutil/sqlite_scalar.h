#pragma once
// One number out of a results database, for tests that check what a run wrote.

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <string>

namespace kvtier::testing {

// The first column of the first row of `sql` as a double; -1 if there is no row. A statement
// that does not prepare fails the test (naming it).
inline double Scalar(sqlite3* db, const std::string& sql) {
  sqlite3_stmt* st = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr), SQLITE_OK) << sql;
  double v = -1;
  if (sqlite3_step(st) == SQLITE_ROW) v = sqlite3_column_double(st, 0);
  sqlite3_finalize(st);
  return v;
}

}  // namespace kvtier::testing
