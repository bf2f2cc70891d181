// The failures kept for a sync or step end: reported once, the first with the count, and said to
// have lost nothing only when every one of them kept its tensor valid.
#include "lib/runtime/failure_log.h"

#include <gtest/gtest.h>

#include "lib/base/status.h"

namespace tiermem {
namespace {

constexpr const char* kNothingLost = "nothing was lost";

TEST(FailureLog, MovesThatKeptTheirTensorsSaySo) {
  FailureLog log;
  log.Record(1, "a", Error(TM_ERR_NO_SPACE, "the nvme tier is full: tensor \"a\""), true);
  log.Record(2, "b", Error(TM_ERR_IO, "write failed: tensor \"b\""), true);
  absl::Status s = log.Take(0);
  EXPECT_EQ(ToTmStatus(s), TM_ERR_NO_SPACE) << s;
  EXPECT_NE(s.message().find("2 asynchronous moves failed; the first"), absl::string_view::npos)
      << s;
  EXPECT_NE(s.message().find("(each of these moves left its tensor valid where it was: nothing "
                             "was lost)"),
            absl::string_view::npos)
      << s;
  EXPECT_EQ(ErrorFlags(s), TM_ERROR_NOTHING_LOST) << "the C boundary's flag, beside the text";
  EXPECT_EQ(ErrorFlags(WithContext(s, "tm_step_end")), TM_ERROR_NOTHING_LOST)
      << "kept on the way up";
  EXPECT_TRUE(log.Take(0).ok()) << "reported once";

  log.Record(3, "c", Error(TM_ERR_IO, "read failed: tensor \"c\""), true);
  s = log.Take(3);
  EXPECT_EQ(ToTmStatus(s), TM_ERR_IO) << s;
  EXPECT_NE(s.message().find("(the move left its tensor valid"), absl::string_view::npos) << s;
}

TEST(FailureLog, ALossAmongThemIsNotCalledHarmless) {
  FailureLog log;
  log.Record(1, "a", Error(TM_ERR_NO_SPACE, "the nvme tier is full"), true);
  log.Record(2, "b", Error(TM_ERR_DEVICE, "copy_in of tensor \"b\""), false);
  absl::Status s = log.Take(0);
  EXPECT_EQ(ToTmStatus(s), TM_ERR_NO_SPACE) << s;
  EXPECT_EQ(s.message().find(kNothingLost), absl::string_view::npos) << s;
  EXPECT_EQ(ErrorFlags(s), 0u) << s;

  log.Record(2, "b", Error(TM_ERR_DEVICE, "copy_in of tensor \"b\""), false);
  log.Record(1, "a", Error(TM_ERR_IO, "offload of tensor \"a\""), true);
  s = log.Take(2);  // only b's
  EXPECT_EQ(ToTmStatus(s), TM_ERR_DEVICE) << s;
  EXPECT_EQ(s.message().find(kNothingLost), absl::string_view::npos) << s;
  EXPECT_EQ(ErrorFlags(s), 0u) << s;
  s = log.Take(0);  // a's, left behind
  EXPECT_EQ(ToTmStatus(s), TM_ERR_IO) << s;
  EXPECT_NE(s.message().find(kNothingLost), absl::string_view::npos) << s;
}

}  // namespace
}  // namespace tiermem
