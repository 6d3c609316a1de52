# data module: IDX reader, datasets, transforms, image folders, distributed sampler, loader (serial).
trainscope_add_test(NAME data_unit_tests TORCH
  SOURCES unit/test_idx.cpp unit/test_sampler.cpp unit/test_loader.cpp
          unit/test_image_folder.cpp unit/test_tokenizer.cpp unit/test_text_dataset.cpp
  LIBS trainscope::data ZLIB::ZLIB PkgConfig::TURBOJPEG PkgConfig::LIBPNG nlohmann_json::nlohmann_json
       LABELS data)
# The sampler test does not include LibTorch.
set_source_files_properties(unit/test_sampler.cpp PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
# data_tokenize: a helper program (not a test) that tests/python/test_tokenizer_reference.py runs
# to compare the tokenizers with Python tiktoken and HF tokenizers. It compiles the tokenizer
# source itself, so that it links without LibTorch.
add_executable(data_tokenize unit/data_tokenize.cpp
               ${PROJECT_SOURCE_DIR}/modules/data/src/tokenizer.cpp)
target_include_directories(data_tokenize PRIVATE ${PROJECT_SOURCE_DIR}/modules/data/include)
target_link_libraries(data_tokenize PRIVATE trainscope::core PkgConfig::PCRE2
                      nlohmann_json::nlohmann_json)
