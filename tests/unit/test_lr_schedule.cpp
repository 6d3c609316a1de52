// Learning-rate schedules: warm-up, step and cosine values users compare with PyTorch's schedulers.
#include <gtest/gtest.h>

#include <cmath>

#include "trainscope/train/lr_schedule.hpp"

using trainscope::train::LrSchedule;

TEST(LrSchedule, WarmupIsLinearThenConstant) {
    LrSchedule s{"constant", 0.4, 4, 100, 1, 0.1, 0.0};
    EXPECT_DOUBLE_EQ(s.at(0), 0.1);
    EXPECT_DOUBLE_EQ(s.at(3), 0.4);
    EXPECT_DOUBLE_EQ(s.at(50), 0.4);
}

TEST(LrSchedule, StepDecaysEveryPeriod) {
    LrSchedule s{"step", 1.0, 0, 100, 10, 0.5, 0.0};
    EXPECT_DOUBLE_EQ(s.at(9), 1.0);
    EXPECT_DOUBLE_EQ(s.at(10), 0.5);
    EXPECT_DOUBLE_EQ(s.at(25), 0.25);
}

TEST(LrSchedule, CosineMatchesClosedForm) {
    LrSchedule s{"cosine", 0.2, 0, 101, 1, 0.1, 0.02};
    EXPECT_DOUBLE_EQ(s.at(0), 0.2);
    EXPECT_NEAR(s.at(50), 0.02 + 0.5 * 0.18 * (1 + std::cos(M_PI * 50 / 101.0)), 1e-15);
    EXPECT_NEAR(s.at(101), 0.02, 1e-15);
    EXPECT_NEAR(s.at(500), 0.02, 1e-15); // past the end: stays at the floor
}
