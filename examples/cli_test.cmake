# The command lines of train_heads, curvature and worked_example (ctest example_cli): an output
# path that cannot be written and a bad number are refused before any work, naming the flag, and
# an existing file is left as it was; a learning rate that makes train_heads' loss non-finite
# stops the run at that step, saying so.
# cmake -DTRAIN_HEADS=<program> -DCURVATURE=<program> -DWORKED_EXAMPLE=<program> -DWORK=<scratch dir>
#       -P cli_test.cmake
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")

# refuses(MESSAGE PROGRAM ARGS...): PROGRAM ARGS exits with 1 before any work (nothing on
# stdout), MESSAGE on stderr, and leaves no file in ${WORK} but those there before.
function(refuses message)
  file(GLOB_RECURSE before LIST_DIRECTORIES true "${WORK}/*" "${WORK}/.*")
  execute_process(COMMAND ${ARGN} WORKING_DIRECTORY "${WORK}" RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  file(GLOB_RECURSE after LIST_DIRECTORIES true "${WORK}/*" "${WORK}/.*")
  string(FIND "${err}" "${message}" at)
  if(NOT rc EQUAL 1 OR NOT out STREQUAL "" OR at EQUAL -1 OR NOT before STREQUAL after)
    message(FATAL_ERROR "${ARGN}: wanted exit 1 before any work with '${message}'; got exit ${rc}, "
                        "stdout:\n${out}\nstderr:\n${err}\nfiles before: ${before}\nafter: ${after}")
  endif()
endfunction()

set(small --heads 1 --steps 5 --batch 4 --vocab 2 --seq-len 3 --d-model 4 --d-ff 4 --snapshots 1 --threads 1 --quiet)
file(WRITE "${WORK}/kept.json" "kept")
refuses("--report /proc/version: cannot write /proc/version" "${TRAIN_HEADS}" ${small} --no-files
        --summary kept.json --report /proc/version)
refuses("--summary /proc/version: cannot write /proc/version" "${TRAIN_HEADS}" ${small} --no-files
        --report kept.json --summary /proc/version)
file(READ "${WORK}/kept.json" kept)
if(NOT kept STREQUAL "kept")
  message(FATAL_ERROR "a refused run changed an output file it was given")
endif()
refuses("--out kept.json: cannot make the directory" "${TRAIN_HEADS}" ${small} --out kept.json)
file(MAKE_DIRECTORY "${WORK}/out/loss.svg")
refuses("--out out: cannot write out/loss.svg: Is a directory" "${TRAIN_HEADS}" ${small} --out out)
refuses("--summary and --report name the same file" "${TRAIN_HEADS}" ${small} --no-files --summary a.json
        --report ./a.json)
refuses("--lr: must be a positive finite number, got 'inf'" "${TRAIN_HEADS}" ${small} --no-files --lr inf)
# Each AdamW step moves every weight by about the learning rate: the loss is non-finite by step 2.
execute_process(COMMAND "${TRAIN_HEADS}" ${small} --no-files --lr 1e300 WORKING_DIRECTORY "${WORK}"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 1 OR NOT err MATCHES
   "1 head: the training loss is -?(nan|inf) at step [23]; the learning rate \\(--lr 1e\\+300\\) is likely too large")
  message(FATAL_ERROR "--lr 1e300 did not stop at the first non-finite loss as expected (exit ${rc}):\n${out}\n${err}")
endif()

refuses("--tolerance: must be a positive finite number, got '0'" "${CURVATURE}" --quick --tolerance 0)
refuses("--heads: must be an integer >= 1, got '0'" "${CURVATURE}" --quick --heads 0)
refuses("--json /proc/version: cannot write /proc/version" "${CURVATURE}" --quick --quiet --json /proc/version)
refuses("--svg out: cannot write out: Is a directory" "${CURVATURE}" --quick --quiet --svg out)

refuses("--report /proc/version: cannot write /proc/version" "${WORKED_EXAMPLE}" --report /proc/version)
file(REMOVE_RECURSE "${WORK}")
