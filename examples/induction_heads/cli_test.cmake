# induction_heads end to end (ctest example_induction_heads): the default configuration with one
# seed forms the induction circuit, checked from its summary against the experiment's goals (a
# previous-token head in layer 0 scoring >= 0.5, an induction head in layer 1 scoring >= 0.7,
# K-composition >= 1.3 x its random baseline, the keys-only path ablation cutting the induction
# score by >= 30 % and the queries-only and values-only ones by < 10 %), and writes its page; the
# same check rejects a run too short to form the circuit (its negative control); bad flags are
# refused before any work, naming the flag.
# cmake -DINDUCTION_HEADS=<program> -DWORK=<scratch dir> -P cli_test.cmake
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")

function(run)
  execute_process(COMMAND "${INDUCTION_HEADS}" ${ARGN} WORKING_DIRECTORY "${WORK}" RESULT_VARIABLE rc
                  OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "induction_heads ${ARGN} failed (${rc}):\n${out}\n${err}")
  endif()
  set(out "${out}" PARENT_SCOPE)
endfunction()

# circuit_failures(VAR SUMMARY_FILE): VAR is the list of the goals the summary misses (empty when
# the circuit formed), each saying what was measured. Reads the contract's fields only.
function(circuit_failures var file)
  file(READ "${file}" s)
  set(failed "")
  string(JSON H GET "${s}" config n_heads)
  string(JSON p_layer GET "${s}" previous_token_head 0)
  string(JSON p GET "${s}" previous_token_head 1)
  string(JSON i_layer GET "${s}" induction_head 0)
  string(JSON i GET "${s}" induction_head 1)
  if(NOT p_layer EQUAL 0 OR NOT i_layer EQUAL 1)
    list(APPEND failed "the previous-token head is in layer ${p_layer} and the induction head in layer ${i_layer}")
  endif()
  math(EXPR p_at "${p_layer} * ${H} + ${p}")
  math(EXPR i_at "${i_layer} * ${H} + ${i}")
  string(JSON prev GET "${s}" heads ${p_at} previous_token_score)
  string(JSON ind GET "${s}" heads ${i_at} induction_score)
  string(JSON k GET "${s}" k_composition)
  string(JSON k0 GET "${s}" k_composition_baseline)
  string(JSON ratio GET "${s}" k_composition_ratio)
  if(NOT prev GREATER_EQUAL 0.5)
    list(APPEND failed "previous-token score ${prev} < 0.5")
  endif()
  if(NOT ind GREATER_EQUAL 0.7)
    list(APPEND failed "induction score ${ind} < 0.7")
  endif()
  # The ratio is the summary's; the raw numbers must at least be in that order.
  if(NOT k GREATER k0 OR NOT ratio GREATER_EQUAL 1.3)
    list(APPEND failed "K-composition ${k} against baseline ${k0}: ratio ${ratio} < 1.3")
  endif()
  foreach(input keys queries values)
    string(JSON a GET "${s}" path_ablation ${input} induction_score)
    string(JSON change GET "${s}" path_ablation ${input} relative_change)
    string(JSON loss GET "${s}" path_ablation ${input} loss)
    if(input STREQUAL "keys")
      if(NOT change LESS_EQUAL -0.3 OR NOT a LESS ind)
        list(APPEND failed "keys-only path ablation: induction score ${ind} -> ${a} (change ${change}), wanted a cut >= 30 %")
      endif()
    elseif(change LESS_EQUAL -0.1)
      list(APPEND failed "${input}-only path ablation: induction score ${ind} -> ${a} (change ${change}), wanted a cut < 10 %")
    endif()
  endforeach()
  string(JSON icl GET "${s}" in_context_score)
  if(NOT icl LESS 0)
    list(APPEND failed "in-context score ${icl} is not negative")
  endif()
  string(JSON phase TYPE "${s}" phase_change_step)
  if(NOT phase STREQUAL "NUMBER")
    list(APPEND failed "no phase change step")
  endif()
  set(${var} "${failed}" PARENT_SCOPE)
endfunction()

# The default configuration, one seed.
run(--seed 1 --summary default.json --report default.html)
circuit_failures(failed "${WORK}/default.json")
# REQUIRE_CIRCUIT (examples/induction_heads/CMakeLists.txt, on by default) makes a missed goal fail
# the test; off, a missed goal is a warning (for a machine where a run is known to differ).
if(failed)
  string(REPLACE ";" "\n  " failed "${failed}")
  if(REQUIRE_CIRCUIT)
    message(FATAL_ERROR "the default run did not form the induction circuit:\n  ${failed}\n${out}")
  endif()
  message(WARNING "the default run did not form the canonical induction circuit:\n  ${failed}")
elseif(NOT out MATCHES "the induction circuit formed")
  message(FATAL_ERROR "the summary meets the goals but the run did not say the circuit formed:\n${out}")
endif()
if(NOT EXISTS "${WORK}/default.html")
  message(FATAL_ERROR "the default run wrote no page:\n${out}")
endif()
file(READ "${WORK}/default.html" page)
foreach(id loss-chart in-context-chart head-scores k-composition path-ablation goals)
  string(FIND "${page}" "id=\"${id}\"" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "the page has no id=\"${id}\"")
  endif()
endforeach()

# Negative control: 40 steps form no circuit, and the same check says so.
run(--seed 1 --steps 40 --eval-interval 20 --test-sequences 64 --quiet --summary short.json)
circuit_failures(failed "${WORK}/short.json")
if(NOT failed)
  message(FATAL_ERROR "the check accepted a run of 40 steps as a formed circuit")
endif()
if(NOT out MATCHES "did not form")
  message(FATAL_ERROR "a run of 40 steps did not say the circuit did not form:\n${out}")
endif()

# refuses(MESSAGE ARGS...): induction_heads ARGS exits with 1 before any work (nothing on stdout,
# no new file in ${WORK}), MESSAGE on stderr.
function(refuses message)
  file(GLOB_RECURSE before LIST_DIRECTORIES true "${WORK}/*")
  execute_process(COMMAND "${INDUCTION_HEADS}" ${ARGN} WORKING_DIRECTORY "${WORK}" RESULT_VARIABLE rc
                  OUTPUT_VARIABLE out ERROR_VARIABLE err)
  file(GLOB_RECURSE after LIST_DIRECTORIES true "${WORK}/*")
  string(FIND "${err}" "${message}" at)
  if(NOT rc EQUAL 1 OR NOT out STREQUAL "" OR at EQUAL -1 OR NOT before STREQUAL after)
    message(FATAL_ERROR "induction_heads ${ARGN}: wanted exit 1 before any work with '${message}'; got exit ${rc}, "
                        "stdout:\n${out}\nstderr:\n${err}\nfiles before: ${before}\nafter: ${after}")
  endif()
endfunction()

set(small --steps 2 --test-sequences 8 --quiet)
refuses("--period-max 33: a segment of 33 tokens repeated does not fit in --seq-len 64" ${small} --period-max 33)
refuses("--train-on: text not in {markov,repeat}" ${small} --train-on text)
refuses("--period-max 5 is below --period-min 6" ${small} --period-max 5)
refuses("--period-min: must be an integer >= 1, got '0'" ${small} --period-min 0)
refuses("--d-model 60 is not divisible by --heads 8" ${small} --d-model 60 --heads 8)
refuses("--steps: must be an integer >= 1, got '0'" ${small} --steps 0)
refuses("--lr: must be a positive finite number, got 'nan'" ${small} --lr nan)
refuses("--threads: must be an integer from 1 to 256, got '0'" ${small} --threads 0)
refuses("--seed: must be an integer >= 0, got '-1'" ${small} --seed -1)
refuses("--vocab: must be an integer >= 2, got '1e3'" ${small} --vocab 1e3)
refuses("--summary /proc/version: cannot write /proc/version" ${small} --summary /proc/version)
file(MAKE_DIRECTORY "${WORK}/a_dir")
refuses("--report a_dir: is a directory" ${small} --report a_dir)
refuses("--summary and --report name the same file" ${small} --summary same.html --report ./same.html)
refuses("The following argument was not expected: --no-such-flag" ${small} --no-such-flag)
# A learning rate that makes the loss non-finite stops the run at that step, saying so.
execute_process(COMMAND "${INDUCTION_HEADS}" --steps 5 --test-sequences 8 --quiet --lr 1e300 --summary lr.json
                WORKING_DIRECTORY "${WORK}" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 1 OR NOT err MATCHES "the training loss is -?(nan|inf) at step [2-5]; the learning rate \\(--lr 1e\\+300\\)"
   OR EXISTS "${WORK}/lr.json")
  message(FATAL_ERROR "--lr 1e300 did not stop at the first non-finite loss (exit ${rc}):\n${out}\n${err}")
endif()
file(REMOVE_RECURSE "${WORK}")
