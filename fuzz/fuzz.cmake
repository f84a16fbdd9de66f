# libFuzzer targets (DEFT_FUZZ=ON, clang): every fuzz/fuzz_*.c is one executable linked with libFuzzer's main,
# ASan and UBSan, over the library built with coverage instrumentation (CMakeLists.txt). scripts/fuzz.sh configures,
# builds and runs them; `fuzz_x --write-seeds DIR` writes a target's seed corpus.
file(GLOB DEFT_FUZZ_TARGETS CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/fuzz/fuzz_*.c)
set(DEFT_FUZZ_FLAGS -fsanitize=fuzzer,address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all)
foreach(src ${DEFT_FUZZ_TARGETS})
  get_filename_component(name ${src} NAME_WE)
  add_executable(${name} ${src})
  target_link_libraries(${name} PRIVATE deft)
  target_compile_options(${name} PRIVATE ${DEFT_C_WARNINGS} ${DEFT_FUZZ_FLAGS})
  target_link_options(${name} PRIVATE ${DEFT_FUZZ_FLAGS})
endforeach()
