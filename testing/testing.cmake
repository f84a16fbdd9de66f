# deft_testing: the test support (testing/deft_testing.h) that tests and benchmarks link. Its sources may include any
# internal header, so tests never need to; it is not part of libdeft.a and is never installed.
file(GLOB DEFT_TESTING_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/testing/*.c)
add_library(deft_testing STATIC ${DEFT_TESTING_SOURCES})
target_include_directories(deft_testing PUBLIC ${PROJECT_SOURCE_DIR}/testing PRIVATE ${DEFT_LAYER_DIRS})
target_link_libraries(deft_testing PUBLIC deft PRIVATE deft_flags)
target_compile_options(deft_testing PRIVATE ${DEFT_C_WARNINGS} ${DEFT_SAN_FLAGS})
