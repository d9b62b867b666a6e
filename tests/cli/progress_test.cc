// cli/progress.h: the lines a long command prints, on a fake clock (no timing in the test):
// one line per interval in a file, one rewritten line on a terminal, rate and ETA from the
// counts, nothing with --quiet.

#include "cli/progress.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace kvtier::cli {
namespace {

// Progress writing into a temporary file on a clock the test moves.
class ProgressTest : public ::testing::Test {
 protected:
  void SetUp() override { file_ = std::tmpfile(); }
  void TearDown() override { std::fclose(file_); }

  ProgressOptions Options(ProgressOptions::Style style, double interval_s = 2,
                          bool quiet = false) {
    ProgressOptions o;
    o.style = style;
    o.interval_s = interval_s;
    o.quiet = quiet;
    o.out = file_;
    o.clock = [this] { return now_; };
    return o;
  }
  std::string Text() {
    std::fflush(file_);
    std::rewind(file_);
    std::string s;
    char buf[512];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, file_)) > 0) s.append(buf, n);
    return s;
  }

  std::FILE* file_ = nullptr;
  double now_ = 100;
};

TEST_F(ProgressTest, FileGetsOneLinePerIntervalWithRateAndEta) {
  Progress p("eval piqa", "items", 10, Options(ProgressOptions::Style::kLines, 2));
  now_ = 101;
  p.Update(1);  // 1 s < interval: nothing
  EXPECT_EQ(Text(), "");
  now_ = 102;
  p.Update(3);  // 3 items in 2 s: 1.5/s, 7 left: eta 4.67 s -> "5 s"
  EXPECT_EQ(Text(), "[eval piqa] 3/10 items (30%)  1.5 items/s  eta 5 s  (2 s elapsed)\n");
  now_ = 103;
  p.Update(4);  // 1 s after the last line: nothing
  now_ = 104;
  p.Update(5, "at 1.25 s");
  EXPECT_EQ(Text(),
            "[eval piqa] 3/10 items (30%)  1.5 items/s  eta 5 s  (2 s elapsed)\n"
            "[eval piqa] 5/10 items (50%)  1.25 items/s  eta 4 s  (4 s elapsed)  at 1.25 s\n");
  now_ = 110;
  p.Update(10);  // the last unit: Finish says it
  p.Finish();
  p.Finish();  // idempotent
  EXPECT_EQ(Text(),
            "[eval piqa] 3/10 items (30%)  1.5 items/s  eta 5 s  (2 s elapsed)\n"
            "[eval piqa] 5/10 items (50%)  1.25 items/s  eta 4 s  (4 s elapsed)  at 1.25 s\n"
            "[eval piqa] 10/10 items (100%)  1 items/s  done in 10 s\n");
}

TEST_F(ProgressTest, TerminalRewritesOneLineAndEndsItAtFinish) {
  Progress p("record", "requests", 200, Options(ProgressOptions::Style::kTerminal, 60));
  EXPECT_TRUE(p.terminal());
  now_ = 100.1;
  p.Update(1);  // within the 0.2 s redraw period: nothing
  EXPECT_EQ(Text(), "");
  now_ = 100.5;
  p.Update(2);
  now_ = 200;
  p.Update(150);
  EXPECT_EQ(Text(),
            "\r[record] 2/200 requests (1%)  4 requests/s  eta 50 s  (1 s elapsed)\033[K"
            "\r[record] 150/200 requests (75%)  1.5 requests/s  eta 33 s  (1 min 40 s elapsed)"
            "\033[K");
  now_ = 300;
  p.Finish();
  EXPECT_EQ(Text().substr(Text().rfind('\r')),
            "\r[record] 150/200 requests (75%)  0.75 requests/s  done in 3 min 20 s\033[K\n");
}

TEST_F(ProgressTest, UnknownTotalHasNoPercentageAndNoEta) {
  Progress p("trace gen", "records", 0, Options(ProgressOptions::Style::kLines, 1));
  now_ = 104;
  p.Update(8000);
  EXPECT_EQ(Text(), "[trace gen] 8000 records  2000 records/s  (4 s elapsed)\n");
  p.set_total(10000);
  now_ = 105;
  p.Update(9000);
  EXPECT_EQ(Text().substr(Text().find('\n') + 1),
            "[trace gen] 9000/10000 records (90%)  1800 records/s  eta 1 s  (5 s elapsed)\n");
}

TEST_F(ProgressTest, LongRunsPrintHoursAndMinutes) {
  Progress p("hw spec", "requests", 1000, Options(ProgressOptions::Style::kLines, 1));
  now_ = 100 + 3600;
  p.Update(200);  // 0.0556/s, 800 left: 4 h
  EXPECT_EQ(Text(),
            "[hw spec] 200/1000 requests (20%)  0.0556 requests/s  eta 4 h 00 min  "
            "(1 h 00 min elapsed)\n");
}

TEST_F(ProgressTest, QuietPrintsNothing) {
  {
    Progress p("record", "requests", 4, Options(ProgressOptions::Style::kTerminal, 1, true));
    now_ = 200;
    p.Update(2);
    p.Finish();
  }
  {
    Progress p("record", "requests", 4, Options(ProgressOptions::Style::kLines, 1, true));
    now_ = 300;
    p.Update(2);
    p.Finish();
  }
  EXPECT_EQ(Text(), "");
}

TEST_F(ProgressTest, AnUnfinishedTerminalLineIsEndedWhenDestroyed) {
  {
    Progress p("eval copa", "items", 4, Options(ProgressOptions::Style::kTerminal));
    now_ = 101;
    p.Update(1);
  }  // an exception left the loop: the shell prompt must not start mid-line
  const std::string text = Text();
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n');
  EXPECT_EQ(text.front(), '\r');
}

TEST_F(ProgressTest, AutoStyleIsLinesForAFile) {
  Progress p("x", "items", 2, Options(ProgressOptions::Style::kAuto));
  EXPECT_FALSE(p.terminal());  // a tmpfile is not a terminal
}

}  // namespace
}  // namespace kvtier::cli
