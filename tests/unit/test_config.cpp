// Configuration: defaults, file/command-line precedence, and every error path a user can hit.
#include <gtest/gtest.h>

#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "trainscope/core/config.hpp"
#include "trainscope/core/error.hpp"
#include "trainscope/core/text.hpp"
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

TEST_F(ConfigTest, AKeyTwiceInOneFileIsAnErrorNamingBothLines) {
    auto r = registry();
    auto msg = error_of(r, {"--config", write("dup.ini", "[train]\nbatch_size = 16\nlr = 0.5\n"
                                                         "[run]\nstrategy = ddp\n[train]\n"
                                                         "batch_size = 32\n")});
    EXPECT_NE(msg.find("dup.ini' sets train.batch_size twice, on line 2 and line 7"),
              std::string::npos)
        << msg;
    // Across files the later file wins, as before.
    auto a = write("a.ini", "[train]\nbatch_size = 16\n");
    auto b = write("b.ini", "# comment\n[train]\nbatch_size = 32\n");
    EXPECT_EQ(parse(r, {"--config", a, "--config", b}).config.get_int("train.batch_size"), 32);
}

TEST_F(ConfigTest, TheLastOfARepeatedCommandLineOptionWinsAndEveryValueKnowsItsOrigin) {
    auto r = registry();
    auto f = write("o.ini", "[train]\n\n  lr = 0.5   # a comment\n");
    auto cl = parse(r, {"--config", f, "--train.batch_size=8", "--run.strategy=ddp",
                        "--train.batch_size", "12"});
    EXPECT_EQ(cl.config.get_int("train.batch_size"), 12);
    EXPECT_EQ(cl.config.origin("train.batch_size"),
              "command line, the last of 2 --train.batch_size");
    EXPECT_EQ(cl.config.origin("run.strategy"), "command line");
    EXPECT_EQ(cl.config.origin("train.lr"), f + ":3");
    EXPECT_EQ(cl.config.origin("output.file"), "default");
    const std::string ini = cl.config.to_ini(/*with_origins=*/true);
    EXPECT_NE(ini.find("batch_size = 12  # command line, the last of 2"), std::string::npos) << ini;
    EXPECT_NE(ini.find("lr = 0.5  # " + f + ":3"), std::string::npos) << ini;
    // The annotated text still parses back to the same configuration.
    EXPECT_EQ(parse(r, {"--config", write("again.ini", ini)}).config.items(), cl.config.items());
}

TEST_F(ConfigTest, InputPathsInAFileAreRelativeToThatFile) {
    auto r = registry();
    r.add_input_path("llm.tokenizer", "", "tokenizer");
    r.add_input_path("llm.model", "tiny", "model", {"tiny", "llama3-8b"});
    fs::create_directories(dir / "cfg" / "data");
    const std::string f = write("cfg/job.ini", "[llm]\ntokenizer = data/../data/tok.model\n"
                                               "model = tiny\n[output]\nfile = out/run.h5\n");
    auto cl = parse(r, {"--config", f});
    // Relative to the file's directory, absolute and normalised, whatever the working directory.
    EXPECT_EQ(cl.config.get_string("llm.tokenizer"),
              (fs::absolute(dir) / "cfg" / "data" / "tok.model").lexically_normal().string());
    EXPECT_EQ(cl.config.get_string("llm.model"), "tiny");         // a preset's name, not a path
    EXPECT_EQ(cl.config.get_string("output.file"), "out/run.h5"); // outputs: the working dir's
    EXPECT_EQ(cl.config.origin("llm.tokenizer"), f + ":2");
    // --print-config shows the resolved path, and it parses back to the same value from anywhere.
    const std::string ini = cl.config.to_ini(/*with_origins=*/true);
    EXPECT_NE(ini.find("tokenizer = " + cl.config.get_string("llm.tokenizer") + "  # " + f),
              std::string::npos)
        << ini;
    EXPECT_EQ(parse(r, {"--config", write("elsewhere.ini", ini)}).config.items(),
              cl.config.items());
    // Absolute paths, a model directory and the command line: as given (the command line is
    // relative to the working directory, as a shell's arguments are).
    auto abs = parse(r, {"--config",
                         write("cfg/abs.ini", "[llm]\ntokenizer = /opt/t.model\n"
                                              "model = models/llama\n"),
                         "--llm.tokenizer=rel/t.model"});
    EXPECT_EQ(abs.config.get_string("llm.tokenizer"), "rel/t.model");
    EXPECT_EQ(abs.config.get_string("llm.model"),
              (fs::absolute(dir) / "cfg" / "models" / "llama").lexically_normal().string());
}

TEST_F(ConfigTest, NumbersAreDecimalFiniteAndTrimmed) {
    auto r = registry();
    EXPECT_EQ(parse(r, {"--train.batch_size= 5 "}).config.get_int("train.batch_size"), 5);
    EXPECT_EQ(parse(r, {"--config", write("t.ini", "[train]\nbatch_size =\t7 \r\n")})
                  .config.get_int("train.batch_size"),
              7);
    EXPECT_DOUBLE_EQ(parse(r, {"--train.lr=1e-1"}).config.get_float("train.lr"), 0.1);
    for (const char* v : {"0x10", "inf", "-inf", "nan", "Infinity", "1e400", "1e100", ""}) {
        auto msg = error_of(r, {std::string("--train.lr=") + v});
        EXPECT_NE(msg.find("a number between 0 and 10"), std::string::npos) << v << ": " << msg;
    }
    for (const char* v : {"0x10", "1e100", "-1e100", "5 5", "", "1e3"}) {
        auto msg = error_of(r, {std::string("--train.batch_size=") + v});
        EXPECT_NE(msg.find("an integer between 1 and 4096"), std::string::npos) << v << ": " << msg;
    }
    auto msg = error_of(r, {"--output.file="}); // an empty string: only in a file
    EXPECT_NE(msg.find("output.file = '' is empty on the command line"), std::string::npos) << msg;
    core::OptionRegistry big;
    big.add_int("a.n", 1, "x", 1, 1048576);
    EXPECT_NE(error_of(big, {"--a.n=0"}).find("between 1 and 1048576"), std::string::npos);
}

TEST_F(ConfigTest, LongAndNonUtf8ValuesAreRefusedAndQuotedShort) {
    auto r = registry();
    auto msg = error_of(r, {"--output.file=" + std::string(100000, 'x')});
    EXPECT_NE(msg.find("at most 4096 bytes, not 100000"), std::string::npos) << msg.substr(0, 400);
    EXPECT_LT(msg.size(), 400u);
    msg = error_of(r, {"--output.file=/tmp/caf\xe9.h5"});
    EXPECT_NE(
        msg.find("output.file = '/tmp/caf\\xe9.h5' is not UTF-8 text (byte \\xe9 at offset 8)"),
        std::string::npos)
        << msg;
    EXPECT_FALSE(core::first_invalid_utf8(msg).has_value());
    msg = error_of(r, {"--config", write("latin1.ini", "[train]\n# Gr\xf6\xdf"
                                                       "e\nlr = 1\n")});
    EXPECT_NE(msg.find("latin1.ini' line 2 is not UTF-8 text (byte \\xf6 at column 5)"),
              std::string::npos)
        << msg;
    msg = error_of(r, {"--config", write("utf16.ini", std::string("\xff\xfe[\0t\0", 6))});
    EXPECT_NE(msg.find("is UTF-16 text"), std::string::npos) << msg;
    // A UTF-8 byte-order mark is skipped.
    EXPECT_EQ(parse(r, {"--config", write("bom.ini", "\xef\xbb\xbf[train]\nbatch_size = 3\n")})
                  .config.get_int("train.batch_size"),
              3);
}

TEST_F(ConfigTest, AConfigPathThatIsNoRegularFileIsRefusedWithoutReadingIt) {
    auto r = registry();
    const std::string fifo = (dir / "fifo.ini").string();
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    auto msg = error_of(r, {"--config", fifo}); // opening it would block: no writer
    EXPECT_NE(msg.find("is a FIFO (named pipe), not a regular file"), std::string::npos) << msg;
    msg = error_of(r, {"--config", "/dev/zero"}); // reading it would never end
    EXPECT_NE(msg.find("'/dev/zero' is a character device"), std::string::npos) << msg;
    msg = error_of(r, {"--config", dir.string()});
    EXPECT_NE(msg.find("is a directory"), std::string::npos) << msg;
    const std::string huge = (dir / "huge.ini").string();
    std::filesystem::resize_file(write("huge.ini", ""), 17u << 20);
    msg = error_of(r, {"--config", huge});
    EXPECT_NE(msg.find("more than the 16 MiB"), std::string::npos) << msg;
}

TEST(Text, Utf8ValidationAndPrintableQuoting) {
    EXPECT_FALSE(
        core::first_invalid_utf8("plain ascii, caf\xc3\xa9, \xe2\x82\xac, \xf0\x9f\x98\x80"));
    EXPECT_EQ(core::first_invalid_utf8("ab\xff"), 2u);
    EXPECT_EQ(core::first_invalid_utf8("\xc0\x80"), 0u);         // overlong NUL
    EXPECT_EQ(core::first_invalid_utf8("x\xed\xa0\x80"), 1u);    // a UTF-16 surrogate
    EXPECT_EQ(core::first_invalid_utf8("\xf4\x90\x80\x80"), 0u); // above U+10FFFF
    EXPECT_EQ(core::first_invalid_utf8("\xe2\x82"), 0u);         // cut sequence
    EXPECT_EQ(core::printable("a\xff"
                              "b\x1b[0m\ttab\n"),
              "a\\xffb\\x1b[0m\ttab\n");
    EXPECT_EQ(core::printable(std::string(10, 'x'), 4), "xxxx... (10 bytes)");
    // A cut never splits a character.
    EXPECT_EQ(core::printable("\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac", 4),
              "\xe2\x82\xac\xe2\x82\xac... (9 bytes)");
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

// LibTorch 2.11's wheel exports a statically linked std::filesystem whose remove_all calls a weak
// symbol GCC 12's libstdc++ lacks (address 0: the segfault of gpu_checkpoint_np2 on the GPU
// machine, reproduced here with that wheel). The build puts libstdc++ ahead of libtorch among
// the needed libraries (cmake/TrainscopeDependencies.cmake), so these calls bind to the system's.
TEST(Toolchain, StdFilesystemComesFromLibstdcxx) {
    namespace fs = std::filesystem;
    auto remove_all = static_cast<std::uintmax_t (*)(const fs::path&)>(&fs::remove_all);
    Dl_info info{};
    ASSERT_NE(dladdr(reinterpret_cast<void*>(remove_all), &info), 0);
    ASSERT_NE(info.dli_fname, nullptr);
    EXPECT_NE(std::string(info.dli_fname).find("libstdc++"), std::string::npos)
        << "std::filesystem::remove_all binds to " << info.dli_fname;
    // And a non-empty tree goes (the call that crashed).
    const fs::path root =
        fs::temp_directory_path() / ("trainscope_rmtree_" + std::to_string(::getpid()));
    fs::create_directories(root / "a" / "b");
    std::ofstream(root / "a" / "b" / "f") << "x";
    EXPECT_EQ(fs::remove_all(root), 4U);
    EXPECT_FALSE(fs::exists(root));
}
