# The char_gpt program end to end on the committed test text (ctest example_char_gpt):
#   a straight run of 25 steps, and a run stopped at step 13 then resumed with --resume, give the
#   same losses, evaluations, full validation loss and sample (dropout on, so the generators'
#   states count); --sample reads the checkpoint; a setting given with --resume is refused; a
#   prompt outside the corpus, an output that cannot be written and a bad number are refused
#   before training, naming the flag; a learning rate that makes the loss non-finite stops the
#   run at that step, saying so.
# cmake -DCHAR_GPT=<program> -DDATA=<text> -DWORK=<scratch dir> -P cli_test.cmake
file(REMOVE_RECURSE "${WORK}")
set(flags --data "${DATA}" --n-layer 1 --n-head 2 --n-embd 32 --block-size 16 --batch-size 4 --warmup-iters 5
    --eval-interval 10 --eval-iters 4 --max-new-tokens 40 --dropout 0.1 --threads 1 --quiet)

function(run expect_ok)
  execute_process(COMMAND "${CHAR_GPT}" ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(expect_ok AND NOT rc EQUAL 0)
    message(FATAL_ERROR "char_gpt ${ARGN} failed (${rc}):\n${out}\n${err}")
  elseif(NOT expect_ok AND rc EQUAL 0)
    message(FATAL_ERROR "char_gpt ${ARGN} succeeded but should have failed:\n${out}")
  endif()
  set(out "${out}${err}" PARENT_SCOPE)
endfunction()

# refuses(MESSAGE ARGS...): char_gpt ARGS exits with 1 before any work (nothing on stdout, no
# checkpoint in ${WORK}/refused), MESSAGE on stderr.
function(refuses message)
  execute_process(COMMAND "${CHAR_GPT}" ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  string(FIND "${err}" "${message}" at)
  if(NOT rc EQUAL 1 OR NOT out STREQUAL "" OR at EQUAL -1 OR EXISTS "${WORK}/refused/ckpt.safetensors")
    message(FATAL_ERROR "char_gpt ${ARGN}: wanted exit 1 before any work with '${message}'; got exit ${rc}, "
                        "stdout:\n${out}\nstderr:\n${err}")
  endif()
  file(REMOVE_RECURSE "${WORK}/refused")
endfunction()

run(TRUE ${flags} --max-iters 25 --out "${WORK}/straight")
run(TRUE ${flags} --max-iters 25 --stop-at 13 --out "${WORK}/resumed")
if(NOT out MATCHES "stopped at step 13 of 25")
  message(FATAL_ERROR "--stop-at 13 did not stop there:\n${out}")
endif()
run(TRUE --resume --data "${DATA}" --max-new-tokens 40 --threads 1 --quiet --out "${WORK}/resumed")

file(READ "${WORK}/straight/summary.json" a)
file(READ "${WORK}/resumed/summary.json" b)
foreach(key train_losses evals full_val_loss sample steps)
  string(JSON va GET "${a}" ${key})
  string(JSON vb GET "${b}" ${key})
  if(NOT va STREQUAL vb)
    message(FATAL_ERROR "the resumed run's ${key} differs from the straight run's:\n${vb}\nvs\n${va}")
  endif()
endforeach()
string(JSON steps GET "${a}" steps)
if(NOT steps EQUAL 25)
  message(FATAL_ERROR "the straight run took ${steps} steps, not 25")
endif()
foreach(f loss.svg report.html ckpt.safetensors)
  if(NOT EXISTS "${WORK}/resumed/${f}")
    message(FATAL_ERROR "the run wrote no ${f}")
  endif()
endforeach()

run(TRUE --sample --out "${WORK}/resumed" --max-new-tokens 30 --sample-seed 5)
if(NOT out MATCHES "step 25, 14944 parameters, vocabulary 61" OR NOT out MATCHES "---- sample")
  message(FATAL_ERROR "--sample did not read the checkpoint:\n${out}")
endif()
run(FALSE --resume --lr 0.5 --data "${DATA}" --out "${WORK}/resumed")
if(NOT out MATCHES "leave out --lr")
  message(FATAL_ERROR "--resume with --lr was not refused as expected:\n${out}")
endif()
run(FALSE --data "${WORK}/no such file" --out "${WORK}/x")
if(NOT out MATCHES "no corpus at")
  message(FATAL_ERROR "a missing corpus was not reported:\n${out}")
endif()

set(small --data "${DATA}" --n-layer 1 --n-head 2 --n-embd 16 --block-size 8 --batch-size 2 --max-iters 3 --warmup-iters 1
    --eval-interval 3 --eval-iters 1 --max-new-tokens 5 --threads 1 --quiet --out "${WORK}/refused")
refuses("--start 'a€': the character '€' (U+20AC) is not in the corpus" ${small} --start "a€")
refuses("--temperature: must be a positive finite number, got '0'" ${small} --temperature 0)
refuses("--top-k: must be an integer >= 1, got '0'" ${small} --top-k 0)
refuses("--lr: must be a positive finite number, got '0'" ${small} --lr 0)
refuses("--lr: must be a positive finite number, got 'inf'" ${small} --lr inf)
refuses("--dropout: must be a number >= 0 and below 1, got 'nan'" ${small} --dropout nan)
refuses("--save-init /proc/version: cannot write /proc/version" ${small} --save-init /proc/version)
file(MAKE_DIRECTORY "${WORK}/refused/report.html")
refuses("--out ${WORK}/refused: cannot write ${WORK}/refused/report.html: Is a directory" ${small})
# Each step moves every weight by about the learning rate: the loss is non-finite by step 2.
execute_process(COMMAND "${CHAR_GPT}" ${small} --lr 1e300 RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 1 OR NOT err MATCHES
   "the training loss is -?(nan|inf) at step [23]; the learning rate \\(--lr 1e\\+300\\) is likely too large"
   OR EXISTS "${WORK}/refused/summary.json")
  message(FATAL_ERROR "--lr 1e300 did not stop at the first non-finite loss as expected (exit ${rc}):\n${out}\n${err}")
endif()
file(REMOVE_RECURSE "${WORK}")
