// Configuration: defaults, file/command-line precedence, and every error path a user can hit.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "trainscope/core/config.hpp"
#include "trainscope/core/error.hpp"
#include "trainscope/train/options.hpp"

namespace fs = std::filesystem;
using namespace trainscope;

namespace {

core::OptionRegistry registry() {
    core::OptionRegistry r;
    r.add_int("train.batch_size", 64, "per rank", 1, 4096);
    r.add_float("train.lr", 0.05, "learning rate", 0.0, 10.0);
    r.add_bool("output.overwrite", false, "replace");
    r.add_choice("run.strategy", "ddp-ds", {"ddp-ds", "ddp"}, "strategy");
    r.add_string("output.file", "run.h5", "path");
    return r;
}

class ConfigTest : public ::testing::Test {
  protected:
    fs::path dir;
    void SetUp() override {
        dir = fs::temp_directory_path() /
              ("ts_cfg_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
               ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::create_directories(dir);
    }
    void TearDown() override { fs::remove_all(dir); }
    std::string write(const std::string& name, const std::string& text) {
        std::ofstream(dir / name) << text;
        return (dir / name).string();
    }
    static core::CommandLine parse(const core::OptionRegistry& r, std::vector<std::string> args) {
        args.insert(args.begin(), "trainscope");
        std::vector<const char*> argv;
        for (auto& a : args)
            argv.push_back(a.c_str());
        return core::CommandLine::parse(r, static_cast<int>(argv.size()), argv.data());
    }
    static std::string error_of(const core::OptionRegistry& r, std::vector<std::string> args) {
        try {
            parse(r, std::move(args));
        } catch (const core::ConfigError& e) {
            EXPECT_EQ(e.exit_code(), 2);
            return e.what();
        }
        ADD_FAILURE() << "expected a ConfigError";
        return "";
    }
};

TEST_F(ConfigTest, DefaultsApplyWhenNothingIsGiven) {
    auto r = registry();
    auto cl = parse(r, {});
    EXPECT_EQ(cl.config.get_int("train.batch_size"), 64);
    EXPECT_DOUBLE_EQ(cl.config.get_float("train.lr"), 0.05);
    EXPECT_FALSE(cl.config.get_bool("output.overwrite"));
    EXPECT_EQ(cl.config.get_string("run.strategy"), "ddp-ds");
    EXPECT_TRUE(cl.config.is_default("train.batch_size"));
}

TEST_F(ConfigTest, LaterFilesWinAndCommandLineWinsOverFiles) {
    auto r = registry();
    auto a = write("a.ini", "[train]\nbatch_size = 16\nlr = 0.5\n[run]\nstrategy = ddp\n");
    auto b = write("b.ini", "[train]\nbatch_size = 32\n");
    auto cl = parse(r, {"--config", a, "--config=" + b, "--train.lr=0.25"});
    EXPECT_EQ(cl.config.get_int("train.batch_size"), 32);    // b.ini after a.ini
    EXPECT_DOUBLE_EQ(cl.config.get_float("train.lr"), 0.25); // command line over a.ini
    EXPECT_EQ(cl.config.get_string("run.strategy"), "ddp");  // only in a.ini
    EXPECT_EQ(cl.config.source("train.batch_size"), core::ValueSource::File);
    EXPECT_EQ(cl.config.source("train.lr"), core::ValueSource::CommandLine);
    // Command line before the file on argv still wins.
    auto cl2 = parse(r, {"--train.batch_size", "8", "--config", b});
    EXPECT_EQ(cl2.config.get_int("train.batch_size"), 8);
}

TEST_F(ConfigTest, BoolFlagsAndSpellings) {
    auto r = registry();
    EXPECT_TRUE(parse(r, {"--output.overwrite"}).config.get_bool("output.overwrite"));
    EXPECT_TRUE(parse(r, {"--output.overwrite=yes"}).config.get_bool("output.overwrite"));
    EXPECT_FALSE(parse(r, {"--output.overwrite=off"}).config.get_bool("output.overwrite"));
}

TEST_F(ConfigTest, ResolvedIniReproducesTheConfiguration) {
    auto r = registry();
    auto cl = parse(r, {"--train.batch_size=7", "--run.strategy=ddp"});
    auto again = parse(r, {"--config", write("resolved.ini", cl.config.to_ini())});
    EXPECT_EQ(again.config.items(), cl.config.items());
    // output.* is declared in two separate places: still one [output] block.
    const std::string ini = cl.config.to_ini();
    EXPECT_EQ(ini.find("[output]"), ini.rfind("[output]")) << ini;
}

TEST_F(ConfigTest, UnknownOptionNamesItAndSuggestsTheClosest) {
    auto r = registry();
    auto msg = error_of(r, {"--train.batchsize=3"});
    EXPECT_NE(msg.find("unknown option 'train.batchsize'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("did you mean 'train.batch_size'"), std::string::npos) << msg;
    msg = error_of(r, {"--config", write("u.ini", "[train]\nbatch_szie = 3\n")});
    EXPECT_NE(msg.find("u.ini"), std::string::npos) << msg;
    EXPECT_NE(msg.find("did you mean 'train.batch_size'"), std::string::npos) << msg;
    msg = error_of(r, {"--completely-different"});
    EXPECT_NE(msg.find("unknown option 'completely-different'"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("did you mean"), std::string::npos) << msg;
}

TEST_F(ConfigTest, BadValuesNameKeyValueAndWhatIsAllowed) {
    auto r = registry();
    auto msg = error_of(r, {"--train.batch_size=abc"});
    EXPECT_NE(msg.find("train.batch_size = 'abc'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("an integer between 1 and 4096"), std::string::npos) << msg;
    msg = error_of(r, {"--train.batch_size=0"});
    EXPECT_NE(msg.find("between 1 and 4096"), std::string::npos) << msg;
    msg = error_of(r, {"--train.batch_size=12.5"});
    EXPECT_NE(msg.find("'12.5'"), std::string::npos) << msg;
    msg = error_of(r, {"--train.lr=fast"});
    EXPECT_NE(msg.find("a number between 0 and 10"), std::string::npos) << msg;
    msg = error_of(r, {"--train.lr=nan"});
    EXPECT_NE(msg.find("train.lr"), std::string::npos) << msg;
    msg = error_of(r, {"--run.strategy=zero"});
    EXPECT_NE(msg.find("one of ddp-ds, ddp"), std::string::npos) << msg;
    msg = error_of(r, {"--output.overwrite=maybe"});
    EXPECT_NE(msg.find("true or false"), std::string::npos) << msg;
}

TEST_F(ConfigTest, FileErrorsNameTheFile) {
    auto r = registry();
    auto msg = error_of(r, {"--config", (dir / "missing.ini").string()});
    EXPECT_NE(msg.find("cannot read config file"), std::string::npos) << msg;
    EXPECT_NE(msg.find("missing.ini"), std::string::npos) << msg;
    msg = error_of(r, {"--config", write("bad.ini", "[train\nbatch_size = 3\n")});
    EXPECT_NE(msg.find("bad.ini"), std::string::npos) << msg;
    msg = error_of(r, {"--config", write("badval.ini", "[train]\nbatch_size = -4\n")});
    EXPECT_NE(msg.find("badval.ini"), std::string::npos) << msg;
    EXPECT_NE(msg.find("train.batch_size"), std::string::npos) << msg;
}

TEST_F(ConfigTest, PositionalArgumentsAreRejected) {
    auto r = registry();
    auto msg = error_of(r, {"quickstart.ini"});
    EXPECT_NE(msg.find("unexpected argument 'quickstart.ini'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("--config"), std::string::npos) << msg;
}

TEST_F(ConfigTest, HelpListsEveryOptionWithItsDefault) {
    const auto all = train::all_options();
    const std::string help = core::CommandLine::usage(all);
    for (const auto& s : all.specs()) {
        EXPECT_NE(help.find("--" + s.key + "="), std::string::npos) << s.key;
        EXPECT_FALSE(s.help.empty()) << s.key;
    }
    EXPECT_NE(help.find("[train]"), std::string::npos);
    EXPECT_NE(help.find("(default: 64)"), std::string::npos);
}

TEST_F(ConfigTest, DeclaringAnInvalidDefaultIsABug) {
    core::OptionRegistry r;
    EXPECT_THROW(r.add_int("a.b", 0, "x", 1, 2), core::InternalError);
    EXPECT_THROW(r.add_int("nodot", 1, "x"), core::InternalError);
}

} // namespace
