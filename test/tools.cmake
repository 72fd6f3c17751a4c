# The tools (tools/): the model layer tables, and poseidon_plan, which prints plans for every
# model at several world sizes and refuses bad input. Included by test/CMakeLists.txt.
add_executable(models_test unit/models_test.cc)
target_link_libraries(models_test PRIVATE poseidon_models GTest::gtest_main)
add_test(NAME models_test COMMAND models_test)
set_tests_properties(models_test PROPERTIES TIMEOUT 60 LABELS "unit;tools")

add_test(NAME poseidon_plan_models
         COMMAND poseidon_plan --model all --np 1,2,8,64 --summary --optimizer adam --sparse)
add_test(NAME poseidon_plan_table
         COMMAND poseidon_plan --model vgg19-22k --np 16 --latency-us 25 --bandwidth-gbit 10)
set_tests_properties(poseidon_plan_table PROPERTIES
                     PASS_REGULAR_EXPRESSION "fc8.w 21841x4096 fc sfb auto")
add_test(NAME poseidon_plan_bad_args COMMAND poseidon_plan --model alexnet)
set_tests_properties(poseidon_plan_models poseidon_plan_table poseidon_plan_bad_args PROPERTIES
                     TIMEOUT 60 LABELS "unit;tools")
set_tests_properties(poseidon_plan_bad_args PROPERTIES WILL_FAIL TRUE)
